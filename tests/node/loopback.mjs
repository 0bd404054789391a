// Preloaded by the MCP tests (`node --import ./loopback.mjs server.js streamableHttp`): the
// server listens on 127.0.0.1 at a port the system picks, and says where on stderr once the
// socket is bound, so a test neither races for a port nor listens beyond loopback.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const done = args.find((a) => typeof a === "function");
  this.once("listening", () => {
    const { address, port } = this.address();
    console.error(`LISTENING ${address}:${port}`);
  });
  return done ? listen.call(this, 0, "127.0.0.1", done) : listen.call(this, 0, "127.0.0.1");
};
