'use strict';
// geoedge sample backend: the Node.js app behind the origin balancer.
//
// One process per port (node server.js 3001), as the balancers in the seed
// articles run it. It reports what it sees of the client (/ip), serves the
// seed's 768 KB "texture" (/large), echoes WebSocket messages (/ws) and has a
// few endpoints for tests of framing, flow control and timeouts. Plain Node:
// the http module plus `ws`; keepAliveTimeout is left at Node's default, as
// users leave it, so that the balancer meets the real idle-close race.
//
// Usage: node server.js [PORT] [--host HOST] [--proxy-protocol]
//        env: PORT, HOST (default 127.0.0.1), PROXY_PROTOCOL=1

const crypto = require('crypto');
const http = require('http');
const { WebSocketServer } = require('ws');
const { acceptProxyProtocol, formatEndpoint } = require('./proxy');

const LARGE_BYTES = 768 * 1024; // the seed's 768 KB texture file
const MAX_BYTES = 1 << 30; // /bytes cap
const MAX_SLOW_MS = 10 * 60 * 1000;
const CHUNK_BYTES = 64 * 1024;
const PATTERN_MODULUS = 251; // byte i of every body is i % 251: easy to check, not 256-periodic

// One buffer holds the pattern from every phase, so that any slice of the
// stream is a subarray: no per-request allocation.
const PATTERN = Buffer.alloc(CHUNK_BYTES + PATTERN_MODULUS);
for (let i = 0; i < PATTERN.length; i++) PATTERN[i] = i % PATTERN_MODULUS;
const LARGE = Buffer.from(patternSlice(0, LARGE_BYTES));

function patternSlice(offset, length) {
  if (length <= CHUNK_BYTES) {
    const start = offset % PATTERN_MODULUS;
    return PATTERN.subarray(start, start + length);
  }
  const out = Buffer.alloc(length);
  for (let i = 0; i < length; i++) out[i] = (offset + i) % PATTERN_MODULUS;
  return out;
}

function parseArgs(argv, env) {
  const options = {
    port: env.PORT !== undefined ? env.PORT : '3000',
    host: env.HOST || '127.0.0.1',
    proxyProtocol: env.PROXY_PROTOCOL === '1' || env.PROXY_PROTOCOL === 'true',
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--proxy-protocol') options.proxyProtocol = true;
    else if (arg === '--host' && i + 1 < argv.length) options.host = argv[++i];
    else if (/^[0-9]+$/.test(arg)) options.port = arg;
    else throw new Error(`unknown argument ${JSON.stringify(arg)} (usage: node server.js [PORT] [--host HOST] [--proxy-protocol])`);
  }
  if (!/^[0-9]+$/.test(String(options.port)) || Number(options.port) > 65535) {
    throw new Error(`port must be 0..65535, got ${JSON.stringify(options.port)}`);
  }
  options.port = Number(options.port);
  return options;
}

function pairs(flat) {
  const out = [];
  for (let i = 0; i + 1 < flat.length; i += 2) out.push([flat[i], flat[i + 1]]);
  return out;
}

function sendJson(res, status, body) {
  const data = Buffer.from(JSON.stringify(body) + '\n');
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': data.length });
  res.end(data);
}

function sendText(res, status, text) {
  const data = Buffer.from(text);
  res.writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', 'Content-Length': data.length });
  res.end(data);
}

function intParam(url, name, min, max) {
  const text = url.searchParams.get(name);
  if (text === null || !/^[0-9]+$/.test(text)) return null;
  const value = Number(text);
  return value >= min && value <= max ? value : null;
}

function unmapped(address) {
  // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d.
  return address && address.startsWith('::ffff:') && address.includes('.') ? address.slice(7) : address || null;
}

function header(req, name) {
  const value = req.headers[name];
  return value === undefined ? null : value;
}

const INDEX_HTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>geoedge sample app</title></head>
<body>
<h1>geoedge sample app</h1>
<p>Served by the backend on port <span id="port"></span>. Your address as seen here: <a href="/ip">/ip</a>.</p>
<p>WebSocket echo: <span id="ws">connecting...</span></p>
<script>
fetch('/ip').then(r => r.json()).then(j => { document.getElementById('port').textContent = j.backend; });
const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws');
ws.onopen = () => ws.send('hello');
ws.onmessage = (e) => { document.getElementById('ws').textContent = 'echoed ' + JSON.stringify(e.data); ws.close(1000); };
ws.onerror = () => { document.getElementById('ws').textContent = 'failed'; };
</script>
</body></html>
`;

function makeHandler(state) {
  return function handle(req, res) {
    const url = new URL(req.url, 'http://backend.invalid');
    switch (url.pathname) {
      case '/': {
        const head = { 'Content-Type': 'text/html; charset=utf-8', 'Content-Length': Buffer.byteLength(INDEX_HTML) };
        // ?max_age=N[&swr=M]: a cacheable page (the edge's cache, make wan).
        const maxAge = intParam(url, 'max_age', 0, 86400);
        const swr = intParam(url, 'swr', 0, 86400);
        if (maxAge !== null) {
          head['Cache-Control'] = `public, max-age=${maxAge}` + (swr !== null ? `, stale-while-revalidate=${swr}` : '');
        }
        res.writeHead(200, head);
        return res.end(INDEX_HTML);
      }
      case '/health':
        return sendText(res, 200, 'ok');
      case '/ip':
        return sendJson(res, 200, {
          remote_address: unmapped(req.socket.remoteAddress),
          remote_port: req.socket.remotePort,
          x_forwarded_for: header(req, 'x-forwarded-for'),
          x_real_ip: header(req, 'x-real-ip'),
          forwarded: header(req, 'forwarded'),
          proxy_protocol_address: req.socket.proxyHeader ? formatEndpoint(req.socket.proxyHeader.source) : null,
          backend: state.port,
          x_forwarded_proto: header(req, 'x-forwarded-proto'),
          x_request_id: header(req, 'x-request-id'),
        });
      case '/headers':
        // The request as this backend received it: names as sent, repeats kept.
        return sendJson(res, 200, {
          method: req.method,
          url: req.url,
          http_version: req.httpVersion,
          raw_headers: pairs(req.rawHeaders),
          backend: state.port,
        });
      case '/large':
        res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': LARGE.length });
        return res.end(LARGE);
      case '/bytes':
        return serveBytes(req, res, url);
      case '/upload':
        return upload(req, res);
      case '/echo':
        return echo(req, res);
      case '/once':
        return once(req, res, state);
      case '/slow':
        return slow(req, res, url);
      case '/gate':
        return gate(req, res, url, state);
      case '/status':
        return status(res, url);
      default:
        return sendText(res, 404, `no such endpoint: ${url.pathname}\n`);
    }
  };
}

function serveBytes(req, res, url) {
  const n = intParam(url, 'n', 0, MAX_BYTES);
  if (n === null) return sendText(res, 400, `n must be an integer 0..${MAX_BYTES}\n`);
  const chunked = url.searchParams.get('chunked') === '1';
  const trailer = chunked && url.searchParams.get('trailer') === '1';
  const headers = { 'Content-Type': 'application/octet-stream' };
  if (!chunked) headers['Content-Length'] = n; // else Node frames it chunked
  if (trailer) headers['Trailer'] = 'X-Bytes';
  res.writeHead(200, headers);
  if (req.method === 'HEAD') return res.end();
  let sent = 0;
  // Write until the socket buffer is full, then wait for 'drain': memory stays
  // bounded however large n is and however slow the reader.
  function pump() {
    while (sent < n) {
      const length = Math.min(CHUNK_BYTES, n - sent);
      const ok = res.write(patternSlice(sent, length));
      sent += length;
      if (!ok) return void res.once('drain', pump);
    }
    if (trailer) res.addTrailers({ 'X-Bytes': String(n) }); // after the last chunk
    res.end();
  }
  res.on('close', () => { sent = n; });
  pump();
}

function upload(req, res) {
  if (req.method !== 'POST' && req.method !== 'PUT') {
    res.setHeader('Allow', 'POST, PUT');
    return sendText(res, 405, 'use POST or PUT\n');
  }
  const hash = crypto.createHash('sha256');
  let bytes = 0;
  req.on('data', (chunk) => {
    bytes += chunk.length;
    hash.update(chunk);
  });
  req.on('end', () => {
    const result = { bytes, sha256: hash.digest('hex') };
    if (Object.keys(req.trailers).length > 0) result.trailers = req.trailers; // a chunked body's
    sendJson(res, 200, result);
  });
}

function once(req, res, state) {
  // Counts each request id this process has seen (a request the chain sends
  // twice answers "seen": 2). Bounded: the oldest ids are forgotten first.
  const id = req.headers['x-once-id'] || '';
  const seen = (state.once.get(id) || 0) + 1;
  state.once.delete(id);
  state.once.set(id, seen);
  if (state.once.size > 200000) state.once.delete(state.once.keys().next().value);
  req.resume();
  req.on('end', () => sendJson(res, 200, { id, seen, backend: state.port }));
}

function echo(req, res) {
  // Keep the request's framing: Content-Length in, Content-Length out;
  // chunked in, chunked out (no Content-Length lets Node frame it chunked).
  const headers = { 'Content-Type': req.headers['content-type'] || 'application/octet-stream' };
  const chunkedIn = /\bchunked\b/i.test(req.headers['transfer-encoding'] || '');
  if (!chunkedIn) headers['Content-Length'] = req.headers['content-length'] || '0';
  res.writeHead(200, headers);
  req.pipe(res);
}

function slow(req, res, url) {
  const ms = intParam(url, 'ms', 0, MAX_SLOW_MS);
  if (ms === null) return sendText(res, 400, `ms must be an integer 0..${MAX_SLOW_MS}\n`);
  const timer = setTimeout(() => sendText(res, 200, `slept ${ms} ms\n`), ms);
  res.on('close', () => clearTimeout(timer));
}

function gate(req, res, url, state) {
  // Holds each request until n requests of its group are held here at once,
  // then answers them all 200 {"together": n}; one that waits ms first gets
  // 504 {"together": k, "wanted": n}. A test proves that requests ran
  // concurrently (or that one was held while something else happened) by
  // this count, not by a clock. A request whose client goes stops counting.
  const n = intParam(url, 'n', 1, 10000);
  if (n === null) return sendText(res, 400, 'n must be an integer 1..10000\n');
  const ms = intParam(url, 'ms', 0, MAX_SLOW_MS);
  if (ms === null) return sendText(res, 400, `ms must be an integer 0..${MAX_SLOW_MS}\n`);
  const group = url.searchParams.get('group') || '';
  req.resume();
  let held = state.gates.get(group);
  if (held === undefined) state.gates.set(group, (held = new Set()));
  if (held.size + 1 >= n) {
    state.gates.delete(group);
    const together = held.size + 1;
    for (const waiter of held) waiter.release(together);
    return sendJson(res, 200, { together });
  }
  const timer = setTimeout(() => {
    forget();
    sendJson(res, 504, { together: held.size + 1, wanted: n });
  }, ms);
  const waiter = {
    release(together) {
      clearTimeout(timer);
      sendJson(res, 200, { together });
    },
  };
  function forget() {
    held.delete(waiter);
    if (held.size === 0 && state.gates.get(group) === held) state.gates.delete(group);
  }
  held.add(waiter);
  res.on('close', () => {
    if (!res.writableEnded) {
      clearTimeout(timer);
      forget();
    }
  });
}

function status(res, url) {
  const code = intParam(url, 'code', 200, 599);
  if (code === null) return sendText(res, 400, 'code must be an integer 200..599\n');
  if (code === 204 || code === 304) {
    res.writeHead(code);
    return res.end();
  }
  return sendText(res, code, `status ${code}\n`);
}

function attachWebSocketEcho(server) {
  // maxPayload 16 MiB: generous for tests, bounded for a sample app.
  const wss = new WebSocketServer({ noServer: true, maxPayload: 16 * 1024 * 1024 });
  wss.on('connection', (ws) => {
    ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
    // Pings are answered and close frames echoed with their code and reason
    // by ws itself (RFC 6455 §5.5.1).
    ws.on('error', () => ws.terminate());
  });
  server.on('upgrade', (req, socket, head) => {
    if (new URL(req.url, 'http://backend.invalid').pathname !== '/ws') {
      socket.end('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => wss.emit('connection', ws, req));
  });
  return wss;
}

function main() {
  let options;
  try {
    options = parseArgs(process.argv.slice(2), process.env);
  } catch (err) {
    console.error(err.message);
    process.exit(2);
  }
  const state = { port: options.port, once: new Map(), gates: new Map() };
  const server = http.createServer(makeHandler(state));
  const wss = attachWebSocketEcho(server);
  const listener = options.proxyProtocol
    ? acceptProxyProtocol(server, { onError: (err) => console.error(`dropped connection: ${err.message}`) })
    : server;
  listener.on('error', (err) => {
    console.error(`cannot listen on ${options.host}:${options.port}: ${err.message}`);
    process.exit(1);
  });
  listener.listen(options.port, options.host, () => {
    state.port = listener.address().port;
    console.log(`listening on ${state.port}`);
  });

  let stopping = false;
  function stop() {
    if (stopping) return;
    stopping = true;
    // Stop accepting; 'close' fires once every accepted connection is gone
    // (in PROXY mode the net listener counts the sockets it handed over).
    listener.close(() => process.exit(0));
    for (const ws of wss.clients) ws.close(1001, 'server shutting down');
    server.closeIdleConnections();
    // In-flight requests get a moment; then everything goes.
    setTimeout(() => {
      server.closeAllConnections();
      for (const ws of wss.clients) ws.terminate();
      process.exit(0);
    }, 2000).unref();
  }
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (require.main === module) main();

module.exports = { parseArgs, patternSlice, LARGE_BYTES };
