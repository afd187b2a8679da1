'use strict';
// PROXY protocol v1 and v2 (haproxy.org/download/2.9/doc/proxy-protocol.txt),
// receiving side only.
//
// Why our own: npm has parsers (proxy-protocol-js), but the part that matters
// here is handing the socket to http.Server with the bytes that followed the
// header, so that keep-alive and WebSocket upgrades work, and that part is
// ours either way. The format is small and fixed, and the sample app keeps a
// single dependency (ws). Two parts:
//
//   parseProxyHeader(buf)  pure: bytes in, a result out, no I/O;
//   acceptProxyProtocol()  a net.Server that reads the header off each new
//                          connection and hands the socket, with any bytes
//                          that followed the header, to an http.Server.

const net = require('net');

const V2_SIGNATURE = Buffer.from([0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a]);
const V2_FIXED_BYTES = 16;
const V1_MAX_BYTES = 107; // spec §2.1: the longest possible v1 line, CRLF included
const V1_PREFIX = Buffer.from('PROXY ');

class ProxyHeaderError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ProxyHeaderError';
  }
}

// Returns null while more bytes are needed, else
//   { headerLength, version, command, source, destination }
// where source/destination are { address, port, family } or null (LOCAL,
// UNKNOWN, UNSPEC or a family without ports). Throws ProxyHeaderError on
// anything that is not a valid header.
function parseProxyHeader(buf) {
  if (buf.length === 0) return null;
  if (buf[0] === V2_SIGNATURE[0]) return parseV2(buf);
  if (buf[0] === V1_PREFIX[0]) return parseV1(buf);
  throw new ProxyHeaderError('connection does not start with a PROXY protocol header');
}

function parseV1(buf) {
  const prefixBytes = Math.min(buf.length, V1_PREFIX.length);
  if (!buf.subarray(0, prefixBytes).equals(V1_PREFIX.subarray(0, prefixBytes))) {
    throw new ProxyHeaderError('bad PROXY v1 prefix');
  }
  const end = buf.indexOf('\r\n');
  if (end === -1) {
    if (buf.length >= V1_MAX_BYTES) throw new ProxyHeaderError('PROXY v1 line longer than 107 bytes');
    return null;
  }
  if (end + 2 > V1_MAX_BYTES) throw new ProxyHeaderError('PROXY v1 line longer than 107 bytes');
  const fields = buf.toString('latin1', 0, end).split(' ');
  const result = { headerLength: end + 2, version: 1, command: 'PROXY', source: null, destination: null };
  if (fields[1] === 'UNKNOWN') return result; // the rest of the line is to be ignored
  if (fields.length !== 6 || (fields[1] !== 'TCP4' && fields[1] !== 'TCP6')) {
    throw new ProxyHeaderError(`bad PROXY v1 line: ${JSON.stringify(fields.join(' '))}`);
  }
  const family = fields[1] === 'TCP4' ? 4 : 6;
  result.source = v1Endpoint(fields[2], fields[4], family);
  result.destination = v1Endpoint(fields[3], fields[5], family);
  return result;
}

function v1Endpoint(address, portText, family) {
  if (net.isIP(address) !== family) {
    throw new ProxyHeaderError(`bad IPv${family} address in PROXY v1 line: ${JSON.stringify(address)}`);
  }
  // Ports are decimal without leading zeros (spec §2.1).
  if (!/^(0|[1-9][0-9]{0,4})$/.test(portText) || Number(portText) > 65535) {
    throw new ProxyHeaderError(`bad port in PROXY v1 line: ${JSON.stringify(portText)}`);
  }
  return { address, port: Number(portText), family };
}

function parseV2(buf) {
  const signatureBytes = Math.min(buf.length, V2_SIGNATURE.length);
  if (!buf.subarray(0, signatureBytes).equals(V2_SIGNATURE.subarray(0, signatureBytes))) {
    throw new ProxyHeaderError('bad PROXY v2 signature');
  }
  if (buf.length < V2_FIXED_BYTES) return null;
  const versionCommand = buf[12];
  if (versionCommand >> 4 !== 2) throw new ProxyHeaderError(`unsupported PROXY v2 version ${versionCommand >> 4}`);
  const command = versionCommand & 0x0f;
  if (command > 1) throw new ProxyHeaderError(`unknown PROXY v2 command ${command}`);
  const familyProtocol = buf[13];
  const length = buf.readUInt16BE(14);
  if (buf.length < V2_FIXED_BYTES + length) return null;
  const result = {
    headerLength: V2_FIXED_BYTES + length,
    version: 2,
    command: command === 0 ? 'LOCAL' : 'PROXY',
    source: null,
    destination: null,
  };
  if (command === 0) return result; // LOCAL: the proxy's own connection (health checks)
  const body = buf.subarray(V2_FIXED_BYTES, V2_FIXED_BYTES + length);
  const addressFamily = familyProtocol >> 4;
  if (addressFamily === 1 || addressFamily === 2) {
    const size = addressFamily === 1 ? 4 : 16;
    if (length < 2 * size + 4) {
      throw new ProxyHeaderError(`PROXY v2 address block of ${length} bytes is too short for IPv${addressFamily === 1 ? 4 : 6}`);
    }
    const family = addressFamily === 1 ? 4 : 6;
    result.source = { address: ipString(body.subarray(0, size)), port: body.readUInt16BE(2 * size), family };
    result.destination = { address: ipString(body.subarray(size, 2 * size)), port: body.readUInt16BE(2 * size + 2), family };
  } else if (addressFamily > 3) {
    throw new ProxyHeaderError(`unknown PROXY v2 address family ${addressFamily}`);
  }
  // UNSPEC (0) and UNIX (3) carry no IP source; TLVs after the addresses are ignored.
  return result;
}

function ipString(bytes) {
  if (bytes.length === 4) return Array.from(bytes).join('.');
  const groups = [];
  for (let i = 0; i < 16; i += 2) groups.push(bytes.readUInt16BE(i).toString(16));
  // Let the URL parser compress it to the canonical (RFC 5952) form.
  return new URL(`http://[${groups.join(':')}]/`).hostname.slice(1, -1);
}

function formatEndpoint(endpoint) {
  if (endpoint === null) return null;
  return endpoint.family === 6 ? `[${endpoint.address}]:${endpoint.port}` : `${endpoint.address}:${endpoint.port}`;
}

// A net.Server for `target` (an http.Server that does not listen itself):
// every connection must start with a PROXY header, read within `timeoutMs`.
// The parsed header goes on socket.proxyHeader; the socket is then given to
// `target`, with the bytes that followed the header put back in front.
function acceptProxyProtocol(target, { timeoutMs = 10000, onError = () => {} } = {}) {
  return net.createServer((socket) => {
    let buffered = Buffer.alloc(0);
    const timer = setTimeout(() => fail(new ProxyHeaderError(`no PROXY header within ${timeoutMs} ms`)), timeoutMs);
    function fail(err) {
      clearTimeout(timer);
      socket.removeListener('data', onData);
      onError(err, socket);
      socket.destroy();
    }
    function onData(chunk) {
      buffered = buffered.length ? Buffer.concat([buffered, chunk]) : chunk;
      let header;
      try {
        header = parseProxyHeader(buffered);
      } catch (err) {
        fail(err);
        return;
      }
      if (header === null) return;
      clearTimeout(timer);
      socket.removeListener('data', onData);
      socket.proxyHeader = header;
      // Synchronously from here on: no 'data' event can fire before the
      // http.Server has attached its own listener.
      const rest = buffered.subarray(header.headerLength);
      if (rest.length > 0) socket.unshift(rest);
      target.emit('connection', socket);
    }
    socket.on('data', onData);
    socket.on('error', () => {}); // a reset during the header; the http.Server handles later ones
    socket.once('close', () => clearTimeout(timer));
  });
}

module.exports = { ProxyHeaderError, parseProxyHeader, formatEndpoint, acceptProxyProtocol, V2_SIGNATURE };
