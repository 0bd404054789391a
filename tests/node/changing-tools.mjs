// An MCP server, written with the official TypeScript SDK, whose tool list changes on demand:
// its tool `add_tool` registers a tool named by its argument, and the SDK then sends
// `notifications/tools/list_changed`. The tests use it to see that change reach a client over
// stdio and over streamable HTTP (`node changing-tools.mjs stdio|http`; over HTTP it listens on
// 127.0.0.1 at a port the system picks and prints `LISTENING 127.0.0.1:PORT` on stderr, and
// answers the GET for its own stream half a second late).
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

function server() {
  const mcp = new McpServer({ name: "changing-tools", version: "1.0.0" });
  mcp.registerTool(
    "add_tool",
    { description: "Adds a tool named `name`.", inputSchema: { name: z.string() } },
    async ({ name }) => {
      mcp.registerTool(name, { description: `The tool ${name}.` }, async () => ({
        content: [{ type: "text", text: `${name} called` }],
      }));
      return { content: [{ type: "text", text: `added ${name}` }] };
    },
  );
  return mcp;
}

if (process.argv[2] === "http") {
  // One session: the test is the only client.
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID() });
  await server().connect(transport);
  const listener = http.createServer((req, res) => {
    if (!req.url.startsWith("/mcp")) {
      res.writeHead(404).end();
      return;
    }
    // The GET that opens the stream for the server's own messages is answered late, so a
    // client that does not wait for it misses the list change a call right after connecting
    // makes (the SDK drops such a message while no stream is open).
    if (req.method === "GET") {
      setTimeout(() => transport.handleRequest(req, res), 500);
    } else {
      transport.handleRequest(req, res);
    }
  });
  listener.listen(0, "127.0.0.1", () => {
    const { address, port } = listener.address();
    console.error(`LISTENING ${address}:${port}`);
  });
} else {
  await server().connect(new StdioServerTransport());
}
