'use strict'
// `engine.stream(request)`: the events of `engine.complete` as an async
// iterator. Breaking out of the loop (or `return()`) aborts the request.

const { checkSignal } = require('./wire.js')

/** The events of `complete(request, onEvent, signal)` as an async iterable. */
function eventStream(complete, request, signal) {
  const queue = []
  let wake = null
  let finished = false
  let failure = null
  const controller = new AbortController()
  const forward = () => controller.abort()
  if (signal != null) {
    checkSignal(signal)
    if (signal.aborted) controller.abort()
    else signal.addEventListener('abort', forward, { once: true })
  }
  const push = () => {
    if (wake) {
      wake()
      wake = null
    }
  }
  const done = complete(request, (event) => {
    queue.push(event)
    push()
  }, controller.signal)
  done.then(
    () => {
      finished = true
      push()
    },
    (e) => {
      failure = e
      finished = true
      push()
    },
  )
  const cleanup = () => {
    if (signal != null) signal.removeEventListener('abort', forward)
  }
  return {
    [Symbol.asyncIterator]() {
      return this
    },
    async next() {
      for (;;) {
        if (queue.length > 0) return { value: queue.shift(), done: false }
        if (finished) {
          cleanup()
          if (failure) {
            const e = failure
            failure = null
            throw e
          }
          return { value: undefined, done: true }
        }
        await new Promise((r) => (wake = r))
      }
    },
    async return() {
      controller.abort()
      await done.catch(() => {})
      cleanup()
      queue.length = 0
      return { value: undefined, done: true }
    },
  }
}

module.exports = { eventStream }
