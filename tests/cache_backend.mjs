// A Node.js backend for the cache's tests: every response is what the query
// asks for, and every request is counted by path, so a test can tell what
// reached Node.js.
//
//   GET /any/path?cc=public,max-age=60&vary=Accept&cookie=a%3Db&tag=t1%20t2
//        &type=text/plain&size=2000&delay=300&etag=%22v1%22&lm=<http date>
//        &status=200&chunked=1&echo=x-forwarded-host&fail_after=N&body_delay=ms
//   -> the status, Cache-Control `cc`, Vary `vary`, Set-Cookie `cookie`,
//      Surrogate-Key `tag`, Content-Type `type` (default text/plain), ETag,
//      Last-Modified; a body of `size` octets (default: a JSON description
//      of the request), after `delay` ms, chunked when `chunked=1`; with
//      `body_delay`, the head and the body's first half at once and the rest
//      `body_delay` ms later. A request
//      whose If-None-Match equals `etag` gets a 304; past the `fail_after`th
//      request for the path, a 503.
//   GET /_count?path=/any/path  -> {"count": N} (requests seen for that path)
//
// Usage: node cache_backend.mjs PORT
import http from 'http'

const port = parseInt(process.argv[2], 10)
const counts = new Map()

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://backend.invalid')
  if (url.pathname === '/_count') {
    const path = url.searchParams.get('path')
    res.setHeader('content-type', 'application/json')
    res.setHeader('cache-control', 'no-store')
    res.end(JSON.stringify({ count: counts.get(path) || 0 }))
    return
  }
  counts.set(url.pathname, (counts.get(url.pathname) || 0) + 1)
  const q = url.searchParams
  const n = counts.get(url.pathname)
  const respond = () => {
    res.setHeader('x-backend-count', String(n))
    if (q.has('cc')) res.setHeader('cache-control', q.get('cc'))
    if (q.has('vary')) res.setHeader('vary', q.get('vary'))
    if (q.has('cookie')) res.setHeader('set-cookie', q.get('cookie'))
    if (q.has('tag')) res.setHeader('surrogate-key', q.get('tag'))
    if (q.has('etag')) res.setHeader('etag', q.get('etag'))
    if (q.has('lm')) res.setHeader('last-modified', q.get('lm'))
    res.setHeader('content-type', q.get('type') || 'text/plain')
    if (q.has('etag') && req.headers['if-none-match'] === q.get('etag')) {
      res.statusCode = 304
      res.end()
      return
    }
    res.statusCode = parseInt(q.get('status') || '200', 10)
    if (q.has('fail_after') && n > parseInt(q.get('fail_after'), 10)) {
      res.statusCode = 503 // the origin in trouble: later requests fail
      res.setHeader('cache-control', 'no-store')
    }
    let body
    if (q.has('size')) {
      const size = parseInt(q.get('size'), 10)
      const line = 'geoedge cache test body line, compressible text. '
      body = Buffer.from(line.repeat(Math.ceil(size / line.length) + 1).slice(0, size))
    } else {
      const echo = {}
      for (const name of (q.get('echo') || '').split(',').filter(Boolean)) {
        echo[name] = req.headers[name] || null
      }
      body = Buffer.from(JSON.stringify({ path: url.pathname, count: n, method: req.method, echo }))
    }
    if (q.get('chunked') !== '1') res.setHeader('content-length', String(body.length))
    if (req.method === 'HEAD') {
      res.end()
      return
    }
    if (q.has('body_delay')) {
      res.write(body.subarray(0, body.length >> 1))
      setTimeout(() => res.end(body.subarray(body.length >> 1)), parseInt(q.get('body_delay'), 10))
      return
    }
    if (q.get('chunked') === '1') { // two writes: Node frames them chunked
      res.write(body.subarray(0, body.length >> 1))
      res.write(body.subarray(body.length >> 1))
      res.end()
      return
    }
    res.end(body)
  }
  const delay = parseInt(q.get('delay') || '0', 10)
  if (delay > 0) setTimeout(respond, delay)
  else respond()
})
server.keepAliveTimeout = 5000
server.listen(port, '127.0.0.1')
