// Starts and stops a real Observatory gateway for the browser tests, and drives
// agents over its HTTP API the way a real agent would.
//
// The gateway runs as `mix run --no-halt` in the test environment (its fixed
// secret_key_base keeps sign-ins valid across a restart), on a free loopback port,
// with the demo fleet off and an operator token of its own from the environment.
// Each agent gets its own agent key, issued through the operator API on first use.
import { spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import path from "node:path";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const OPERATOR = "browser-operator";
export const OPERATOR_TOKEN = "browser-operator-token";

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

export class Gateway {
  // `env`: more environment for the gateway (OBSERVATORY_LLM_UPSTREAM, ...).
  constructor(port, logPath, env = {}) {
    this.port = port;
    this.base = `http://127.0.0.1:${port}`;
    this.logPath = logPath;
    this.env = env;
    this.proc = null;
    this.keys = new Map();
  }

  async start(timeoutMs = 120_000) {
    this.keys = new Map(); // a test gateway's data directory is new at every start
    const log = createWriteStream(this.logPath, { flags: "a" });
    this.proc = spawn("mix", ["run", "--no-halt"], {
      cwd: ROOT,
      env: {
        ...process.env,
        MIX_ENV: "test",
        OBSERVATORY_PORT: String(this.port),
        OBSERVATORY_IP: "127.0.0.1",
        OBSERVATORY_DEMO: "0",
        OBSERVATORY_OPERATOR_TOKENS: `${OPERATOR}:${OPERATOR_TOKEN}`,
        ...this.env,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.proc.stdout.pipe(log);
    this.proc.stderr.pipe(log);
    const exited = new Promise((resolve) => this.proc.once("exit", resolve));
    this.exited = exited;

    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.proc.exitCode !== null) throw new Error(`the gateway exited; see ${this.logPath}`);
      try {
        const res = await fetch(`${this.base}/healthz`);
        if (res.ok) return;
      } catch (_notYet) {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    throw new Error(`the gateway did not answer /healthz in ${timeoutMs} ms; see ${this.logPath}`);
  }

  async stop() {
    if (!this.proc || this.proc.exitCode !== null) return;
    this.proc.kill("SIGTERM");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 15_000);
    await this.exited;
    clearTimeout(timer);
  }

  // ---- agents -------------------------------------------------------------------

  // The agent's own key: issued by the operator API (which registers the agent) once.
  async keyFor(agentId) {
    if (!this.keys.has(agentId)) {
      const res = await fetch(`${this.base}/api/v1/agents/${encodeURIComponent(agentId)}/keys`, {
        method: "POST",
        headers: { authorization: `Bearer ${OPERATOR_TOKEN}` },
      });
      if (res.status !== 201) throw new Error(`issuing a key answered ${res.status}: ${await res.text()}`);
      this.keys.set(agentId, (await res.json()).key);
    }
    return this.keys.get(agentId);
  }

  async step(sessionId, agentId, [intent, toolCall, status]) {
    const key = await this.keyFor(agentId);
    const res = await fetch(`${this.base}/api/v1/decision_logs`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({
        meta: {
          step_id: `${sessionId}-${Math.random().toString(36).slice(2)}`,
          session_id: sessionId,
          agent_id: agentId,
          timestamp: new Date().toISOString(),
        },
        cognition: { intent, entropy_score: 0.9 },
        action: { tool_call: toolCall, status },
      }),
    });
    if (res.status !== 200) throw new Error(`decision_log answered ${res.status}: ${await res.text()}`);
    return res.json();
  }

  // One step with a tool input and a result, as a coding agent sends it.
  async call(sessionId, agentId, { intent, tool, input, status, result }) {
    const key = await this.keyFor(agentId);
    const res = await fetch(`${this.base}/api/v1/decision_logs`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({
        meta: {
          step_id: `${sessionId}-${Math.random().toString(36).slice(2)}`,
          session_id: sessionId,
          agent_id: agentId,
          timestamp: new Date().toISOString(),
        },
        cognition: { intent },
        action: { tool_call: tool, tool_input: input, status, result },
      }),
    });
    if (res.status !== 200) throw new Error(`decision_log answered ${res.status}: ${await res.text()}`);
    return res.json();
  }

  async calls(sessionId, agentId, calls) {
    const answers = [];
    for (const c of calls) answers.push(await this.call(sessionId, agentId, c));
    return answers;
  }

  async pause(sessionId) {
    const res = await fetch(`${this.base}/api/v1/sessions/${encodeURIComponent(sessionId)}/pause`, {
      method: "POST",
      headers: { authorization: `Bearer ${OPERATOR_TOKEN}` },
    });
    if (res.status !== 200) throw new Error(`pause answered ${res.status}: ${await res.text()}`);
  }

  async steps(sessionId, agentId, steps) {
    const answers = [];
    for (const s of steps) answers.push(await this.step(sessionId, agentId, s));
    return answers;
  }

  // One request through the chat-completions proxy, as agent `agentId`: its own key,
  // and the same id in X-Agent-Id (optional; it must match the key's agent).
  async chat(agentId, prompt) {
    const key = await this.keyFor(agentId);
    const res = await fetch(`${this.base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        authorization: `Bearer ${key}`,
        "x-agent-id": agentId,
      },
      body: JSON.stringify({ model: "stub-model", messages: [{ role: "user", content: prompt }] }),
    });
    return { status: res.status, body: await res.json() };
  }

  // The operator API's view of an agent.
  async agent(agentId) {
    const res = await fetch(`${this.base}/api/v1/agents/${encodeURIComponent(agentId)}`, {
      headers: { authorization: `Bearer ${OPERATOR_TOKEN}` },
    });
    return { status: res.status, body: await res.json() };
  }

  async session(sessionId) {
    const res = await fetch(`${this.base}/api/v1/sessions/${encodeURIComponent(sessionId)}`, {
      headers: { authorization: `Bearer ${OPERATOR_TOKEN}` },
    });
    return { status: res.status, body: await res.json() };
  }
}

// A coding agent re-running the same failing test: the command, the same failure.
export const PYTEST_FAILURE = [
  "============================= test session starts ==============================",
  "collected 4 items",
  "",
  "tests/test_auth.py ...F",
  "",
  "    def test_login_returns_token(client):",
  '        resp = client.post("/login", json={"user": "ada", "password": "pw"})',
  ">       assert resp.status_code == 200",
  "E       assert 401 == 200",
  "",
  "tests/test_auth.py:31: AssertionError",
  "FAILED tests/test_auth.py::test_login_returns_token - assert 401 == 200",
  "========================= 1 failed, 3 passed in 0.42s ==========================",
].join("\n");

export const pytestLoop = (n, intents = ["Let me re-run the tests", "Running pytest again to check"]) =>
  Array.from({ length: n }, (_, i) => ({
    intent: intents[i % intents.length],
    tool: "bash",
    input: { command: "pytest tests/test_auth.py -x" },
    status: "failure",
    result: { exit_code: 1, stdout: PYTEST_FAILURE },
  }));

export const LOOP_STEP = ["search", "read_file", "failure"];
export const loop = (n) => Array.from({ length: n }, () => LOOP_STEP);
export const healthy = (n) =>
  Array.from({ length: n }, (_, i) => [`plan-${i}`, `tool-${i}`, "success"]);

// Debian's chromium, headless, with the flags a closed network needs; dialogs are
// dismissed and recorded so a test can assert that none was opened.
const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";

export async function openBrowser(chromium, viewport, dialogs) {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  page.on("dialog", async (dialog) => {
    dialogs.push(dialog.message());
    await dialog.dismiss();
  });
  return { browser, context, page };
}
