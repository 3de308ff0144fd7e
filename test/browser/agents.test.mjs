// The agents pages and the kill switch in a real browser: Debian's chromium driven by
// playwright-core, against a real gateway (gateway.mjs) whose chat-completions proxy
// forwards to a stub upstream on loopback (upstream.mjs), which also receives the
// kill switch's webhook alerts. Agents reach the gateway the way real ones do:
// POST /v1/chat/completions with their own agent key (issued through the operator API).
//
//   node --test test/browser/agents.test.mjs     (bin/test runs it after mix test)
//
// Screenshots go to test/browser/artifacts/. With UPDATE_README_SCREENSHOT=1 the trip
// test also refreshes docs/agent_detail.png.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";
import { Gateway, OPERATOR_TOKEN, ROOT, freePort, healthy, openBrowser } from "./gateway.mjs";
import { startUpstream } from "./upstream.mjs";

const ARTIFACTS = path.join(ROOT, "test/browser/artifacts");
mkdirSync(ARTIFACTS, { recursive: true });

const HOSTILE = "<img src=x onerror=alert(1)>";
const shot = (page, name, opts = {}) =>
  page.screenshot({ path: path.join(ARTIFACTS, name), ...opts });
const attr = (value) => JSON.stringify(value);
const agentRow = (id) => `tr.agent-row[data-agent-id=${attr(id)}]`;
const agentUrl = (id) => `/agents/${encodeURIComponent(id)}`;
// A looping agent: the same request but for a number, answered the same each time.
const attempt = (k) => `Attempt ${k}: deploy build 4821`;

let upstream;
let gateway;
let dataDir;
let browser;
let context;
let page;
const dialogs = [];

async function signIn(p) {
  await p.goto(`${gateway.base}/`);
  assert.equal(new URL(p.url()).pathname, "/login");
  await p.fill("#token", OPERATOR_TOKEN);
  await p.click('button[type="submit"]');
  await p.waitForURL(`${gateway.base}/`);
  await p.waitForSelector('body[data-live="live"]');
}

// Opens a page and waits until its event stream has mounted (the page is live).
async function open(p, pathname) {
  await p.goto(`${gateway.base}${pathname}`);
  await p.waitForSelector('body[data-live="live"]');
}

const toggle = (p) => p.getByRole("switch", { name: "Kill switch" });
const status = (p) => p.locator("#agent-status");

async function waitFor(check, what, timeoutMs = 5_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`timed out waiting for ${what}`);
}

describe("Agent Detail and the kill switch in chromium", { timeout: 300_000 }, () => {
  before(async () => {
    upstream = await startUpstream();
    dataDir = mkdtempSync(path.join(tmpdir(), "observatory-browser-agents-"));
    gateway = new Gateway(await freePort(), path.join(ARTIFACTS, "gateway-agents.log"), {
      OBSERVATORY_LLM_UPSTREAM: upstream.url,
      OBSERVATORY_DATA_DIR: dataDir,
    });
    await gateway.start();
    ({ browser, context, page } = await openBrowser(chromium, { width: 1366, height: 900 }, dialogs));
  });

  after(async () => {
    await browser?.close();
    await gateway?.stop();
    await upstream?.close();
    if (dataDir) rmSync(dataDir, { recursive: true, force: true });
  });

  test("the agents pages need a sign-in", async () => {
    const anonymous = await browser.newContext();
    const p = await anonymous.newPage();
    await p.goto(`${gateway.base}/agents/agent-deploy`);
    assert.equal(new URL(p.url()).pathname, "/login");
    const events = await p.request.get(`${gateway.base}/dashboard/events?view=agents`);
    assert.equal(events.status(), 401);
    await anonymous.close();
  });

  test("an agent issued a key is listed once it proxies a request; the fleet and the nav link to its page", async () => {
    const first = await gateway.chat("agent-deploy", attempt(0));
    assert.equal(first.status, 200);
    assert.equal(first.body.choices[0].message.content, "Deployment failed: timeout.");

    // The same agent also reports DecisionLogs: its fleet node links to its page.
    await signIn(page);
    await gateway.steps("sess-deploy-1", "agent-deploy", healthy(2));
    await page.locator('li.node[data-session-id="sess-deploy-1"] a.node-agent').click();
    await page.waitForURL(`${gateway.base}/agents/agent-deploy`);
    await page.waitForSelector('body[data-live="live"]');
    assert.equal(await page.textContent("#agent-title"), "agent-deploy");

    await page.getByRole("link", { name: "Agents", exact: true }).click();
    await page.waitForURL(`${gateway.base}/agents`);
    await page.waitForSelector('body[data-live="live"]');
    const row = page.locator(agentRow("agent-deploy"));
    assert.equal(await row.locator(".ad-status").textContent(), "Active");
    assert.match(await row.textContent(), /off/);
    await shot(page, "agents.png");
    await row.getByRole("link").click();
    await page.waitForURL(`${gateway.base}/agents/agent-deploy`);
    await page.waitForSelector('body[data-live="live"]');
  });

  test("Kill Switch UI: Toggle visibility — the toggle and its settings are on the Agent Detail page", async () => {
    assert.equal(await toggle(page).getAttribute("aria-checked"), "false");
    assert.ok(await toggle(page).isVisible());
    assert.ok(await page.getByLabel("Window size").isVisible());
    assert.ok(await page.getByLabel("Threshold").isVisible());
    assert.equal(await page.getByLabel("Window size").inputValue(), "5");
    assert.equal(await page.getByLabel("Threshold").inputValue(), "5.5");
    assert.equal(await status(page).textContent(), "Active");
  });

  test("Kill Switch UI: Configure parameters — a refused value shows the backend's message beside its field", async () => {
    await page.getByLabel("Window size").fill("1");
    await page.getByRole("button", { name: "Save settings" }).click();
    await page.waitForSelector("#ks-window_size-error");
    assert.equal(
      await page.textContent("#ks-window_size-error"),
      "Window size must be an integer from 2 to 1000, got: 1",
    );
    assert.equal(await page.getByLabel("Window size").getAttribute("aria-invalid"), "true");
    assert.equal((await gateway.agent("agent-deploy")).body.kill_switch.window_size, 5);

    await page.getByLabel("Window size").fill("5");
    await page.getByLabel("Threshold").fill("8");
    await page.getByRole("button", { name: "Save settings" }).click();
    await page.waitForSelector("#ks-window_size-error", { state: "detached" });
    assert.equal(await page.textContent(".notice"), "Saved: window of 5 requests, threshold 8.0.");
    const api = (await gateway.agent("agent-deploy")).body;
    assert.deepEqual([api.kill_switch.window_size, api.kill_switch.threshold], [5, 8]);
  });

  test("Kill Switch UI: Notification check on enable — the prompt asks for a webhook", async () => {
    await toggle(page).click();
    const prompt = page.getByRole("alertdialog", { name: "Configure alert notifications" });
    await prompt.waitFor();
    assert.equal(await toggle(page).getAttribute("aria-checked"), "true");
    const api = (await gateway.agent("agent-deploy")).body;
    assert.equal(api.kill_switch.enabled, true, "the switch is on");
    assert.equal(api.notifications_configured, false);
    await shot(page, "agent-prompt.png");

    // A hostile value is refused and shown as text, next to the field, in the prompt.
    const bad = `"><img src=x onerror=alert(1)>`;
    await prompt.getByLabel("Webhook URL").fill(bad);
    await prompt.getByRole("button", { name: "Save webhook" }).click();
    await page.waitForSelector("#prompt-webhook-url-error");
    assert.match(await page.textContent("#prompt-webhook-url-error"), /must be an http:\/\/ or https:\/\/ URL/);
    assert.equal(await prompt.getByLabel("Webhook URL").inputValue(), bad);
    assert.equal(await page.locator("img").count(), 0);

    await prompt.getByLabel("Webhook URL").fill(upstream.hookUrl);
    await prompt.getByRole("button", { name: "Save webhook" }).click();
    await page.waitForSelector("#notification-prompt", { state: "detached" });
    await page.waitForSelector('#notifications-panel[data-configured="true"]');
    // A webhook URL is a secret: shown back redacted (its origin), never whole, and the
    // form is not filled with it.
    const redacted = `${new URL(upstream.hookUrl).origin}/…`;
    assert.equal(await page.textContent("#notifications-panel code.ad-url"), redacted);
    assert.equal((await gateway.agent("agent-deploy")).body.notification_webhook, redacted);
    assert.equal(await page.getByLabel("Agent webhook URL").inputValue(), "");
    assert.ok(!(await page.content()).includes(upstream.hookUrl), "the page never holds the URL");
    await shot(page, "agent-webhook-redacted.png");
  });

  test("Display deactivation reason: a trip through the proxy shows \"Deactivated by Kill Switch\" live; Activate shows \"Active\"", async () => {
    await page.evaluate(() => {
      window.__notReloaded = true;
    });
    // Scores 0, 1, 4, 7, then 10 > 8: the fifth request is refused.
    const statuses = [];
    for (let k = 1; k <= 5; k++) statuses.push((await gateway.chat("agent-deploy", attempt(k))).status);
    assert.deepEqual(statuses, [200, 200, 200, 200, 403]);

    await page.waitForSelector('#agent-status[data-status="deactivated_by_kill_switch"]', { timeout: 2_000 });
    assert.equal(await status(page).textContent(), "Deactivated by Kill Switch");
    assert.equal(await page.evaluate(() => window.__notReloaded), true, "no reload happened");
    const tripped = page.locator('li[data-event-type="kill_switch"]');
    assert.match(
      await tripped.textContent(),
      /Score 10\.00 exceeded the threshold 8\.00: 4 similar prompts × 1\.0 \+ 3 similar responses × 2\.0 \+ 0 repeated tool calls × 1\.5, over 5 of 5 requests\./,
    );
    await waitFor(() => page.locator("#score-value").count(), "the score panel");
    assert.equal(await page.textContent("#score-value"), "10.00");

    // The alert went to the webhook configured from the prompt.
    await waitFor(() => upstream.hooks.some((h) => h.event_type === "kill_switch"), "the webhook alert");
    const hook = upstream.hooks.find((h) => h.event_type === "kill_switch");
    assert.equal(hook.agent_id, "agent-deploy");
    assert.equal(hook.details.score, 10);

    const answer = await gateway.chat("agent-deploy", attempt(6));
    assert.equal(answer.status, 403);
    assert.equal(answer.body.error.code, "agent_inactive");

    await page.emulateMedia({ reducedMotion: "reduce" });
    await page.mouse.move(0, 0);
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 1366, `no horizontal scroll at 1366 px (page is ${width} px wide)`);
    await shot(page, "agent-tripped.png", { fullPage: true });
    if (process.env.UPDATE_README_SCREENSHOT === "1") {
      await page.screenshot({ path: path.join(ROOT, "docs/agent_detail.png"), fullPage: true });
    }

    await page.getByRole("button", { name: "Activate" }).click();
    await page.waitForSelector('#agent-status[data-status="active"]');
    assert.equal(await status(page).textContent(), "Active");
    const api = (await gateway.agent("agent-deploy")).body;
    assert.equal(api.active, true);
    assert.equal(api.deactivated_by, null);
    assert.equal(api.events[0].event_type, "activation");
    assert.equal(api.events[0].details.operator, "browser-operator");
    assert.equal((await gateway.chat("agent-deploy", attempt(7))).status, 200, "its window starts empty");
  });

  test("Display manual deactivation: Deactivate from the page shows the standard \"Inactive\"", async () => {
    await page.getByLabel("Reason").fill("maintenance window");
    await page.getByRole("button", { name: "Deactivate" }).click();
    await page.waitForSelector('#agent-status[data-status="inactive"]');
    assert.equal(await status(page).textContent(), "Inactive");
    assert.match(await page.textContent('li[data-event-type="manual_deactivation"]'), /browser-operator \(maintenance window\)/);
    const api = (await gateway.agent("agent-deploy")).body;
    assert.equal(api.deactivated_by, "manual");
    assert.equal((await gateway.chat("agent-deploy", attempt(8))).status, 403);

    await page.getByRole("button", { name: "Activate" }).click();
    await page.waitForSelector('#agent-status[data-status="active"]');
  });

  test("Notification check on enable: another agent without notifications gets the prompt; Not now keeps the switch on", async () => {
    assert.equal((await gateway.chat("agent-quiet", "hello")).status, 200);
    await open(page, agentUrl("agent-quiet"));
    assert.equal(await page.locator("#notification-prompt").count(), 0, "no prompt before enabling");
    await toggle(page).click();
    const prompt = page.getByRole("alertdialog", { name: "Configure alert notifications" });
    await prompt.waitFor();
    assert.match(await prompt.textContent(), /nobody will be told/);
    await prompt.getByRole("button", { name: "Not now" }).click();
    await page.waitForSelector("#notification-prompt", { state: "detached" });
    assert.equal(await toggle(page).getAttribute("aria-checked"), "true");
    assert.equal((await gateway.agent("agent-quiet")).body.kill_switch.enabled, true);
    assert.equal(await page.getAttribute("#notifications-panel", "data-configured"), "false");
  });

  test("a hostile agent id from X-Agent-Id is text on both pages: no element, no script, no dialog", async () => {
    assert.equal((await gateway.chat(HOSTILE, "hello")).status, 200);
    await open(page, "/agents");
    const row = page.locator(agentRow(HOSTILE));
    await row.waitFor();
    assert.equal(await row.getByRole("link").textContent(), HOSTILE);
    assert.equal(await page.locator("#agent-list img").count(), 0);

    await row.getByRole("link").click();
    await page.waitForURL((url) => decodeURIComponent(url.pathname) === `/agents/${HOSTILE}`);
    await page.waitForSelector('body[data-live="live"]');
    assert.equal(await page.textContent("#agent-title"), HOSTILE);
    assert.equal(await page.title(), `Agent ${HOSTILE} · Observatory`);
    await toggle(page).click();
    await page.waitForSelector("#notification-prompt");
    assert.equal((await gateway.agent(HOSTILE)).body.kill_switch.enabled, true, "the id round-trips intact");
    assert.equal(await page.locator("img").count(), 0);
    assert.deepEqual(dialogs, []);
    await shot(page, "agent-hostile.png");
  });
});
