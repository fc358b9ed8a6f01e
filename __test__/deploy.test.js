// deploy/: the container recipe and the Kubernetes manifests docs/deploy.md
// gives, parsed (a YAML parser, the Dockerfile's instructions) and checked
// field by field against what the server and the published APIs expect:
// the CLI accepts every container's arguments, probes and ports meet, the
// InferencePool (inference.networking.k8s.io/v1) selects the Deployment's
// pods on the port they serve, the drain fits the grace period.
const fs = require('node:fs')
const path = require('node:path')
const YAML = require('yaml')
const { importEsm } = require('./server-helpers')

const DEPLOY = path.join(__dirname, '..', 'deploy')
const docs = (file) => YAML.parseAllDocuments(fs.readFileSync(path.join(DEPLOY, file), 'utf8')).map((d) => {
  expect(d.errors).toEqual([])
  return d.toJS()
})
const objects = () => fs.readdirSync(DEPLOY).filter((f) => f.endsWith('.yaml')).flatMap((f) => docs(f).map((o) => ({ file: f, ...o })))
const flag = (args, name) => {
  const i = args.indexOf(name)
  return i < 0 ? undefined : args[i + 1]
}

let parseServe
beforeAll(async () => {
  ;({ parseServe } = await importEsm(path.join(__dirname, '..', 'bin', 'llama-engine.mjs')))
})

test('every manifest is YAML with apiVersion, kind and a name', () => {
  const all = objects()
  expect(all.map((o) => o.kind).sort()).toEqual(['Deployment', 'Deployment', 'HTTPRoute', 'InferencePool', 'Service'])
  for (const o of all) {
    expect(typeof o.apiVersion).toBe('string')
    expect(o.metadata.name).toMatch(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/)
  }
})

test('Deployments: serve arguments the CLI accepts, probes on /health at the served port, a drain within the grace period', () => {
  for (const d of objects().filter((o) => o.kind === 'Deployment')) {
    expect(d.apiVersion).toBe('apps/v1')
    const labels = d.spec.template.metadata.labels
    for (const [k, v] of Object.entries(d.spec.selector.matchLabels)) expect(labels[k]).toBe(v)
    const [c] = d.spec.template.spec.containers
    expect(c.args[0]).toBe('serve')
    // Every argument is one the CLI takes (strings: YAML numbers would not reach argv).
    for (const a of c.args) expect(typeof a).toBe('string')
    const cli = parseServe(c.args.slice(1), {})
    expect(cli.listen.host).toBe('0.0.0.0')
    // The gateway's Endpoint Picker reads /metrics (501 without --metrics).
    expect(cli.server.metrics).toBe(true)
    const port = c.ports.find((p) => p.name === 'http')
    expect(port.containerPort).toBe(cli.listen.port)
    for (const probe of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
      const p = c[probe]
      if (!p) continue
      if (p.httpGet) expect(p.httpGet.path).toBe('/health')
      expect((p.httpGet ?? p.tcpSocket).port).toBe('http')
    }
    expect(c.readinessProbe.httpGet.path).toBe('/health')
    // SIGTERM after preStop's sleep; running generations get --shutdown-grace; all before SIGKILL.
    const grace = Number(flag(c.args, '--shutdown-grace') ?? 10000) / 1000
    expect(c.lifecycle.preStop.sleep.seconds + grace).toBeLessThan(d.spec.template.spec.terminationGracePeriodSeconds)
    // What the request asks fits under the limit.
    expect(c.resources.requests.memory).toBeDefined()
    if (c.args.includes('--models')) {
      expect(cli.router.dir).toBe(flag(c.args, '--models'))
      const mount = c.volumeMounts.find((m) => m.mountPath === cli.router.dir)
      expect(d.spec.template.spec.volumes.some((v) => v.name === mount.name)).toBe(true)
    } else {
      expect(cli.load.modelPath).toMatch(/^hf:/)
    }
  }
})

test('the InferencePool selects the Deployment’s pods at the port they serve; the route and the Service reach them', () => {
  const all = objects()
  const pool = all.find((o) => o.kind === 'InferencePool')
  const deployment = all.find((o) => o.kind === 'Deployment' && o.metadata.name === 'llama-engine')
  // inference.networking.k8s.io/v1: selector.matchLabels, targetPorts (exactly one), endpointPickerRef.
  expect(pool.apiVersion).toBe('inference.networking.k8s.io/v1')
  expect(Object.keys(pool.spec).sort()).toEqual(['endpointPickerRef', 'selector', 'targetPorts'])
  expect(pool.spec.selector.matchLabels).toEqual(deployment.spec.template.metadata.labels)
  expect(pool.spec.targetPorts).toHaveLength(1)
  const [c] = deployment.spec.template.spec.containers
  expect(pool.spec.targetPorts[0].number).toBe(c.ports[0].containerPort)
  const ref = pool.spec.endpointPickerRef
  expect(ref.name).toMatch(/^[a-z0-9-]+$/)
  expect(ref.port.number).toBeGreaterThan(0)
  expect(['FailOpen', 'FailClose']).toContain(ref.failureMode)
  const route = all.find((o) => o.kind === 'HTTPRoute')
  expect(route.apiVersion).toBe('gateway.networking.k8s.io/v1')
  const backend = route.spec.rules[0].backendRefs[0]
  expect(backend).toEqual({ group: 'inference.networking.k8s.io', kind: 'InferencePool', name: pool.metadata.name })
  const service = all.find((o) => o.kind === 'Service')
  expect(service.spec.selector).toEqual(deployment.spec.template.metadata.labels)
  expect(service.spec.ports[0].targetPort).toBe('http')
})

test('the Dockerfile: the prebuilt package, a non-root user, the served port exposed and health-checked, serve by default', () => {
  const text = fs.readFileSync(path.join(DEPLOY, 'Dockerfile'), 'utf8').replace(/\\\n/g, ' ')
  const lines = text.split('\n').filter((l) => l.trim() && !l.trim().startsWith('#'))
  const instructions = lines.map((l) => {
    const [, op, rest] = /^\s*([A-Z]+)\s+(.*)$/.exec(l)
    return { op, rest: rest.trim() }
  })
  const one = (op) => instructions.filter((i) => i.op === op)
  expect(one('FROM')[0].rest).toMatch(/^node:(2[2-9]|[3-9]\d)/)
  expect(one('RUN').some((i) => /npm install --global .*llama-engine@/.test(i.rest))).toBe(true)
  expect(one('USER').at(-1).rest).not.toBe('root')
  const exposed = Number(one('EXPOSE')[0].rest)
  const cmd = JSON.parse(one('CMD')[0].rest)
  expect(JSON.parse(one('ENTRYPOINT')[0].rest)).toEqual(['llama-engine'])
  const cli = parseServe(cmd.slice(1), {})
  expect(cmd[0]).toBe('serve')
  expect(cli.listen).toEqual({ host: '0.0.0.0', port: exposed })
  expect(one('HEALTHCHECK')[0].rest).toContain(`127.0.0.1:${exposed}/health`)
  // The package version the image installs is this one.
  const version = /LLAMA_ENGINE_VERSION=(\S+)/.exec(text)[1]
  expect(version).toBe(require('../package.json').version)
})
