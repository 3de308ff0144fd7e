// The graded response in a real browser: Debian's chromium driven by playwright-core,
// against a real gateway (gateway.mjs) whose chat-completions proxy forwards to a stub
// model on loopback that answers every turn with the same tool call and reports its
// usage. A tool agent loops through the proxy; the operator sees, on the Agent Detail
// page, its guidance notes (and switches them), its budget (sets a limit, sees a bad
// value refused beside its field, resets a session) and what each session spent since
// its loop began; on the dashboard, the alert row and the Inspect panel say the same.
//
//   node --test test/browser/graded.test.mjs     (bin/test runs it after mix test)
//
// Screenshots go to test/browser/artifacts/.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";
import { Gateway, OPERATOR_TOKEN, ROOT, freePort, openBrowser } from "./gateway.mjs";

const ARTIFACTS = path.join(ROOT, "test/browser/artifacts");
mkdirSync(ARTIFACTS, { recursive: true });
const shot = (page, name, opts = {}) => page.screenshot({ path: path.join(ARTIFACTS, name), ...opts });

const AGENT = "agent-graded-browser";
const SESSION = "sess-graded-browser";

// The model: read_file build.log on every turn, 1,000 input and 100 output tokens.
async function startModel() {
  const requests = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      requests.push(JSON.parse(Buffer.concat(chunks).toString("utf8")));
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          id: "chatcmpl-graded",
          object: "chat.completion",
          model: "gpt-test",
          choices: [
            {
              index: 0,
              finish_reason: "tool_calls",
              message: {
                role: "assistant",
                content: null,
                tool_calls: [
                  {
                    id: `call_${requests.length}`,
                    type: "function",
                    function: { name: "read_file", arguments: '{"path":"build.log"}' },
                  },
                ],
              },
            },
          ],
          usage: { prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100 },
        }),
      );
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/v1`,
    requests,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

let model;
let gateway;
let dataDir;
let browser;
let context;
let page;
const dialogs = [];

async function operator(method, pathname, body) {
  const res = await fetch(`${gateway.base}${pathname}`, {
    method,
    headers: { authorization: `Bearer ${OPERATOR_TOKEN}`, "content-type": "application/json" },
    body: body && JSON.stringify(body),
  });
  const text = await res.text();
  assert.equal(res.status, 200, `${method} ${pathname}: ${text}`);
  return JSON.parse(text);
}

// A tool agent's loop: the conversation re-sent with each result, `turns` times.
async function loop(turns) {
  const key = await gateway.keyFor(AGENT);
  const messages = [{ role: "user", content: "Fix the build." }];
  const statuses = [];
  for (let turn = 0; turn < turns; turn++) {
    const res = await fetch(`${gateway.base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}`, "x-session-id": SESSION },
      body: JSON.stringify({ model: "gpt-test", messages, tools: [{ type: "function", function: { name: "read_file" } }] }),
    });
    statuses.push(res.status);
    const body = await res.json();
    if (res.status !== 200) break;
    const call = body.choices[0].message.tool_calls[0];
    messages.push({ role: "assistant", content: null, tool_calls: [call] });
    messages.push({ role: "tool", tool_call_id: call.id, content: "error: no such file: build.log" });
  }
  return statuses;
}

async function signIn(p) {
  await p.goto(`${gateway.base}/`);
  await p.fill("#token", OPERATOR_TOKEN);
  await p.click('button[type="submit"]');
  await p.waitForURL(`${gateway.base}/`);
  await p.waitForSelector('body[data-live="live"]');
}

async function open(p, pathname) {
  await p.goto(`${gateway.base}${pathname}`);
  await p.waitForSelector('body[data-live="live"]');
}

describe("graded response in chromium: guidance notes, budgets, spend since the loop began", { timeout: 300_000 }, () => {
  before(async () => {
    model = await startModel();
    dataDir = mkdtempSync(path.join(tmpdir(), "observatory-browser-graded-"));
    const prices = path.join(dataDir, "prices.json");
    writeFileSync(prices, JSON.stringify({ "gpt-test": { input: 2.0, output: 8.0 } }));
    gateway = new Gateway(await freePort(), path.join(ARTIFACTS, "gateway-graded.log"), {
      OBSERVATORY_LLM_UPSTREAM: model.url,
      OBSERVATORY_DATA_DIR: dataDir,
      OBSERVATORY_PRICES_FILE: prices,
    });
    await gateway.start();
    ({ browser, context, page } = await openBrowser(chromium, { width: 1366, height: 900 }, dialogs));
    await signIn(page);
  });

  after(async () => {
    await browser?.close();
    await gateway?.stop();
    await model?.close();
    if (dataDir) rmSync(dataDir, { recursive: true, force: true });
  });

  test("a looping agent with guidance notes on: the model reads the note; the page shows it and switches it off", async () => {
    await gateway.keyFor(AGENT);
    await operator("PUT", `/api/v1/agents/${AGENT}/guidance`, { enabled: true });
    // Six turns: five identical steps (the alarm at the fifth), no block yet.
    assert.deepEqual(await loop(6), [200, 200, 200, 200, 200, 200]);
    const notes = model.requests.map((r) => r.messages.at(-1).content).filter((c) => typeof c === "string" && c.includes("[Observatory]"));
    assert.ok(notes.length >= 3, `notes the model read: ${notes.length}`);

    await open(page, `/agents/${AGENT}`);
    const panel = page.locator("#guidance-panel");
    assert.equal(await panel.getAttribute("data-setting"), "on");
    assert.ok((await page.locator(".ad-event-guidance_injected").count()) >= 3);
    await page.getByRole("button", { name: "Off", exact: true }).click();
    await page.waitForSelector('#guidance-panel[data-setting="off"]');
  });

  test("the budget: a refused value beside its field, a limit saved; each session's spend since its loop began; a reset", async () => {
    await open(page, `/agents/${AGENT}`);
    await page.fill("#budget-session_tokens", "-1");
    await page.click('#budget-form button[type="submit"]');
    await page.waitForSelector("#budget-session_tokens-error");
    assert.match(await page.locator("#budget-session_tokens-error").innerText(), /must be an integer >= 0 or null, got: -1/);

    await page.fill("#budget-session_tokens", "20000");
    await page.selectOption("#budget-mode", "enforce");
    await page.click('#budget-form button[type="submit"]');
    await page.waitForSelector("#ad-notice.notice-info");
    assert.equal((await operator("GET", `/api/v1/agents/${AGENT}/budget`)).budget.session_tokens, 20000);

    // Six answers of 1,100 tokens; the loop began at the sixth request (its step was
    // the fifth identical one): one request since.
    const row = page.locator(`tr.ad-session[data-session-id="${SESSION}"]`);
    await row.waitFor();
    const text = await row.innerText();
    assert.match(text, /6\s+6,600\s+\$0\.0168/);
    assert.match(text, /1 request · 1,100 tokens · \$0\.0028/);
    await shot(page, "graded-agent-detail.png", { fullPage: true });
  });

  test("the dashboard: the alert row and the Inspect panel say what the session spent since the loop began", async () => {
    await open(page, "/");
    const alertRow = page.locator(`tr.alert-row[data-session-id="${SESSION}"]`);
    await alertRow.waitFor();
    await page.waitForFunction((sid) => {
      const row = document.querySelector(`tr.alert-row[data-session-id="${sid}"] .spent`);
      return row && /spent since:/.test(row.textContent);
    }, SESSION);
    await alertRow.getByRole("button", { name: "Inspect", exact: true }).click();
    await page.waitForSelector("#inspect-spent");
    assert.match(await page.locator("#inspect-spent").innerText(), /requests · .* tokens · \$/);
    assert.match(await page.locator("#inspect-since-loop").innerText(), /since/);
    await shot(page, "graded-dashboard.png", { fullPage: true });
    assert.deepEqual(dialogs, []);
  });

  test("an operator resets the session's spend from the Agent Detail page", async () => {
    await open(page, `/agents/${AGENT}`);
    const row = page.locator(`tr.ad-session[data-session-id="${SESSION}"]`);
    await row.getByRole("button", { name: "Reset" }).click();
    await page.waitForFunction(() => /Session .* reset/.test(document.querySelector("#ad-notice")?.textContent || ""));
    assert.equal((await operator("GET", `/api/v1/sessions/${SESSION}`)).usage.requests, 0);
  });
});
