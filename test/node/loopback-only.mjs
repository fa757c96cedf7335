// Preloaded (node --import) into servers the tests start that take no listen address, such as
// @modelcontextprotocol/server-everything, which calls app.listen(PORT): a listen without a host
// binds 127.0.0.1 instead of every interface, and a listen on any other host fails, so a test
// never opens a port beyond loopback (test network rule: 127.0.0.0/8 and ::1 only).
import net from "node:net";

const listen = net.Server.prototype.listen;
const loopback = (h) => h === "localhost" || h === "::1" || /^127\./.test(h);

net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "object" && args[0] !== null) {
    const opts = { ...args[0] };
    if (opts.path === undefined) {
      opts.host = opts.host ?? "127.0.0.1";
      if (!loopback(opts.host)) throw new Error(`loopback-only: refused listen on ${opts.host}`);
    }
    return listen.call(this, opts, ...args.slice(1));
  }
  if (typeof args[0] === "number" || /^\d+$/.test(String(args[0]))) {
    if (typeof args[1] === "string") {
      if (!loopback(args[1])) throw new Error(`loopback-only: refused listen on ${args[1]}`);
      return listen.apply(this, args);
    }
    return listen.call(this, Number(args[0]), "127.0.0.1", ...args.slice(1));
  }
  return listen.apply(this, args);
};
