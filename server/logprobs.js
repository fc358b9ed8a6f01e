'use strict'
// Token probabilities as llama-server writes them, from the engine's token
// events (with `n_probs`, each token carries its own `prob` and the top
// `probs` of the distribution it was drawn from):
//
//   { id, token, bytes, logprob, top_logprobs: [{ id, token, bytes, logprob }] }
//
// or, with `post_sampling_probs: true`, `prob` and `top_probs` instead.
// /completion's `completion_probabilities` is a list of them; Chat
// Completions and /v1/completions put the same list in `logprobs.content`
// (OpenAI's shape: its clients read `token`, `logprob`, `bytes` and
// `top_logprobs`).

const { invalid } = require('./errors.js')

// llama-server's logarithm of 0 (JSON has no -Infinity): the lowest float.
const LOWEST = -3.4028234663852886e38
const logOf = (p) => (p > 0 ? Math.log(p) : LOWEST)
const bytesOf = (piece) => [...Buffer.from(piece, 'utf8')]

/** One token's entry; `top` limits its list (OpenAI's top_logprobs may be below n_probs). */
function entry(t, post, top = Infinity) {
  const one = (id, piece, prob) => ({ id, token: piece, bytes: bytesOf(piece), ...(post ? { prob } : { logprob: logOf(prob) }) })
  const list = (t.probs || []).slice(0, top).map((p) => one(p.id, p.piece, p.prob))
  return { ...one(t.id, t.piece, t.prob ?? 0), [post ? 'top_probs' : 'top_logprobs']: list }
}

/** The entries of some tokens; undefined when the request asked for none. */
function tokenProbs(tokens, { post = false, top } = {}) {
  if (!tokens.some((t) => Array.isArray(t.probs))) return undefined
  return tokens.map((t) => entry(t, post, top))
}

/**
 * The OpenAI endpoints' fields: `logprobs: true` with `top_logprobs` (chat,
 * default 20 as llama-server's), or `logprobs: N` (/v1/completions); and
 * `post_sampling_probs`. Returns the engine's `n_probs` (0: none asked) and
 * how to write them.
 */
function openaiLogprobs(body, chat) {
  const post = body.post_sampling_probs === true
  if (chat) {
    if (body.logprobs != null && typeof body.logprobs !== 'boolean') throw invalid('logprobs', 'expected true or false')
    if (body.logprobs !== true) {
      if (body.top_logprobs != null) throw invalid('top_logprobs', 'requires logprobs to be true')
      return { n: 0, post }
    }
    const top = body.top_logprobs ?? 20
    if (!Number.isInteger(top) || top < 0 || top > 256) throw invalid('top_logprobs', 'expected an integer from 0 to 256')
    // The chosen token's own probability comes with the distribution: at least one.
    return { n: Math.max(1, top), top, post }
  }
  if (body.logprobs == null || body.logprobs === false) return { n: 0, post }
  const top = body.logprobs === true ? 1 : body.logprobs
  if (!Number.isInteger(top) || top < 0 || top > 256) throw invalid('logprobs', 'expected an integer from 0 to 256')
  return { n: Math.max(1, top), top, post }
}

module.exports = { tokenProbs, openaiLogprobs }
