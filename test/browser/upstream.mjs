// A stand-in for the LLM upstream and for an alert webhook, on loopback, for the
// browser tests: the gateway's chat-completions proxy forwards to it, and the kill
// switch POSTs its alerts to it.
//
//   POST /v1/chat/completions  → the same chat completion every time (a looping agent
//                                gets the same answer, as in seed 003's scenarios)
//   POST /hook                 → 204; the JSON body is kept in `hooks`
import { createServer } from "node:http";

export const ANSWER = "Deployment failed: timeout.";

export async function startUpstream() {
  const hooks = [];
  const requests = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      if (req.method === "POST" && req.url === "/v1/chat/completions") {
        requests.push(body);
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            id: "chatcmpl-browser",
            object: "chat.completion",
            model: "stub-model",
            choices: [
              { index: 0, message: { role: "assistant", content: ANSWER }, finish_reason: "stop" },
            ],
          }),
        );
      } else if (req.method === "POST" && req.url === "/hook") {
        hooks.push(JSON.parse(body));
        res.writeHead(204);
        res.end();
      } else {
        res.writeHead(404, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "no such route" } }));
      }
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const base = `http://127.0.0.1:${server.address().port}`;
  return {
    url: `${base}/v1`,
    hookUrl: `${base}/hook`,
    hooks,
    requests,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}
