// The operator dashboard in a real browser: Debian's chromium driven by
// playwright-core, against a real gateway started by the test (gateway.mjs).
//
//   node --test test/browser/dashboard.test.mjs     (bin/test runs it after mix test)
//
// Screenshots go to test/browser/artifacts/ (kept by CI as test artifacts). With
// UPDATE_README_SCREENSHOT=1 the last test also refreshes docs/dashboard.png.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import path from "node:path";
import { chromium } from "playwright-core";
import {
  Gateway,
  OPERATOR_TOKEN,
  ROOT,
  freePort,
  healthy,
  loop,
  openBrowser,
  pytestLoop,
} from "./gateway.mjs";

const ARTIFACTS = path.join(ROOT, "test/browser/artifacts");
mkdirSync(ARTIFACTS, { recursive: true });

// Two steps alternating (edit, failing build): WARNING, never LOOP.
const pingPong = (n) =>
  Array.from({ length: n }, (_, i) =>
    i % 2 === 0 ? ["fix", "edit_file", "success"] : ["check", "run_build", "failure"],
  );

const shot = (page, name, opts = {}) =>
  page.screenshot({ path: path.join(ARTIFACTS, name), ...opts });

// CSS attribute selectors for agent-chosen ids: quote and escape for the selector.
const attr = (value) => JSON.stringify(value);
const alertRow = (sid) => `tr.alert-row[data-session-id=${attr(sid)}]`;
const fleetNode = (sid) => `li.node[data-session-id=${attr(sid)}]`;

let gateway;
let browser;
let context;
let page;
const dialogs = [];

async function signIn(p) {
  await p.goto(`${gateway.base}/`);
  assert.equal(new URL(p.url()).pathname, "/login", "an anonymous visit lands on /login");
  await p.fill("#token", OPERATOR_TOKEN);
  await p.click('button[type="submit"]');
  await p.waitForURL(`${gateway.base}/`);
  await p.waitForSelector('body[data-live="live"]');
}

describe("Session Cluster Manager in chromium", { timeout: 300_000 }, () => {
  before(async () => {
    gateway = new Gateway(await freePort(), path.join(ARTIFACTS, "gateway.log"));
    await gateway.start();
    ({ browser, context, page } = await openBrowser(chromium, { width: 1440, height: 900 }, dialogs));
  });

  after(async () => {
    await browser?.close();
    await gateway?.stop();
  });

  test("every page needs an operator sign-in; a wrong token is refused", async () => {
    const anonymous = await context.browser().newContext();
    const p = await anonymous.newPage();
    await p.goto(`${gateway.base}/`);
    assert.equal(new URL(p.url()).pathname, "/login");
    await p.fill("#token", "not-a-token");
    await p.click('button[type="submit"]');
    await p.waitForSelector(".form-error");
    assert.match(await p.textContent(".form-error"), /not an operator token/);
    const events = await p.request.get(`${gateway.base}/dashboard/events`);
    assert.equal(events.status(), 401);
    await shot(p, "login.png");
    await anonymous.close();

    await signIn(page);
    assert.match(await page.textContent(".operator"), /browser-operator/);
  });

  test("a looping agent's alert appears once, within 1 s, even after several alerts", async () => {
    const sid = "sess-browser-loop";
    await gateway.steps(sid, "agent-looper", loop(4));

    const started = Date.now();
    const answer = await gateway.step(sid, "agent-looper", loop(1)[0]);
    assert.equal(answer.severity, "loop");
    await page.waitForSelector(alertRow(sid), { timeout: 1_000 });
    const elapsed = Date.now() - started;
    assert.ok(elapsed < 1_000, `the alert took ${elapsed} ms to reach the page`);

    // Three more alerts for the same session: the row is updated, never repeated.
    await gateway.steps(sid, "agent-looper", loop(3));
    await page.waitForSelector(`${alertRow(sid)}[data-alerts="4"]`);
    assert.equal(await page.locator(alertRow(sid)).count(), 1);

    const row = page.locator(alertRow(sid));
    assert.equal(await row.locator(".agent").textContent(), "agent-looper");
    assert.match(await row.locator("td.score").textContent(), /0\.20$/);
    assert.match(await row.locator("td.pattern").textContent(), /search.*read_file.*failure/);
    assert.equal(await row.locator(".count").textContent(), "5 of 5 steps in the window");
    assert.match(await row.locator("td.when").textContent(), /\d\d:\d\d:\d\d UTC/);
    await page.waitForSelector(`${fleetNode(sid)}[data-state="alert_entropy"]`);
    await shot(page, "alert.png");
  });

  test("Pause and Inspect pauses the session (confirmed by the API) and its node turns paused", async () => {
    const sid = "sess-browser-loop";
    await page.locator(alertRow(sid)).getByRole("button", { name: "Pause and Inspect" }).click();

    await page.waitForSelector(`#inspector[data-paused="true"]`);
    // Its eight steps, the last five in the entropy window, all eight the verdict's evidence.
    assert.equal(await page.locator("#inspector .steplist li.step").count(), 8);
    assert.equal(await page.locator('#inspector li.step[data-window="true"]').count(), 5);
    assert.match(await page.textContent("#inspector .pause-box"), /Paused by browser-operator/);

    const api = await gateway.session(sid);
    assert.equal(api.status, 200);
    assert.equal(api.body.paused, true);
    assert.equal(api.body.pause.operator, "browser-operator");

    await page.waitForSelector(`${fleetNode(sid)}[data-state="paused"]`);
    await shot(page, "paused.png", { fullPage: true });

    // The agent keeps sending: its steps are told to pause and the node stays paused.
    const answer = await gateway.step(sid, "agent-looper", loop(1)[0]);
    assert.equal(answer.paused, true);
    assert.equal(answer.directives[0].type, "pause");
    await page.waitForSelector(`${alertRow(sid)}[data-alerts="5"]`);
    assert.equal(await page.getAttribute(fleetNode(sid), "data-state"), "paused");

    await page.locator("#inspector").getByRole("button", { name: "Resume" }).click();
    await page.waitForSelector(`#inspector[data-paused="false"]`);
    assert.equal((await gateway.session(sid)).body.paused, false);
    // Still looping: the resumed node flashes red again at once.
    await page.waitForSelector(`${fleetNode(sid)}[data-state="alert_entropy"]`, { timeout: 1_000 });
    await page.locator("#inspector").getByRole("button", { name: "Close" }).click();
    await page.waitForSelector("#inspector:not([data-session-id])");
  });

  test("a hostile session id is shown as text: no element, no script, no dialog", async () => {
    const sid = "<img src=x onerror=alert(1)>";
    await gateway.steps(sid, "<b>agent</b>", loop(5));
    await page.waitForSelector(alertRow(sid));

    assert.equal(await page.locator(alertRow(sid)).locator(".sid").textContent(), sid);
    assert.equal(await page.locator(alertRow(sid)).locator(".agent").textContent(), "<b>agent</b>");
    assert.equal(await page.locator(`${fleetNode(sid)} .node-sid`).textContent(), sid);
    assert.equal(await page.locator("img").count(), 0);
    assert.equal(await page.locator("#scm b").count(), 0);

    await page.locator(alertRow(sid)).getByRole("button", { name: "Pause and Inspect" }).click();
    await page.waitForSelector(`#inspector[data-paused="true"]`);
    assert.equal((await gateway.session(sid)).body.paused, true, "the id round-trips intact");
    assert.equal(await page.locator("img").count(), 0);
    assert.deepEqual(dialogs, []);
    await shot(page, "hostile.png");
    await page.locator("#inspector").getByRole("button", { name: "Close" }).click();
  });

  test("a 200-byte session id is cut in the step detector: every row keeps its streaks and Reset in view", async () => {
    const long = `sess-${"x".repeat(195)}`;
    await gateway.calls(long, "agent-long-id", pytestLoop(5));
    await gateway.calls("sess-short-id", "agent-long-id", pytestLoop(5));
    const stepRow = (sid) => `#steps-panel tr[data-session-id=${attr(sid)}]`;
    await page.waitForSelector(stepRow(long));
    await page.waitForSelector(stepRow("sess-short-id"));

    const panel = await page.locator("#steps-panel").boundingBox();
    const wrap = await page.$eval("#steps-panel .table-wrap", (el) => [el.scrollWidth, el.clientWidth]);
    assert.ok(wrap[0] <= wrap[1], `the step detector's table fits its panel (${wrap[0]} > ${wrap[1]})`);
    for (const sid of [long, "sess-short-id"]) {
      const reset = await page.locator(stepRow(sid)).getByRole("button", { name: "Reset" }).boundingBox();
      assert.ok(reset.x + reset.width <= panel.x + panel.width, `${sid.slice(0, 12)}…'s Reset is in the panel`);
    }
    // The whole id is still there, for a hover and for the page's own Reset.
    assert.equal(await page.getAttribute(`${stepRow(long)} td.sid`, "title"), long);
    await page.locator("#steps-panel").screenshot({ path: path.join(ARTIFACTS, "steps-long-id.png") });
  });

  test("a session that looped before the page opened is listed on load, once", async () => {
    const sid = "sess-looped-before";
    await gateway.steps(sid, "agent-early", loop(7));

    // The server's first HTML already lists it (no event reached this page).
    const html = await (await context.request.get(`${gateway.base}/`)).text();
    const rows = html.match(new RegExp(`class="alert-row" data-session-id="${sid}"`, "g")) || [];
    assert.equal(rows.length, 1);

    const fresh = await context.newPage();
    await fresh.goto(`${gateway.base}/`);
    await fresh.waitForSelector('body[data-live="live"]');
    assert.equal(await fresh.locator(alertRow(sid)).count(), 1);
    assert.equal(await fresh.getAttribute(alertRow(sid), "data-alerts"), "3");
    assert.match(await fresh.locator(alertRow(sid)).locator("td.when").textContent(), /since \d\d:\d\d:\d\d UTC/);
    await fresh.reload();
    await fresh.waitForSelector('body[data-live="live"]');
    assert.equal(await fresh.locator(alertRow(sid)).count(), 1, "a reload lists it once too");
    await fresh.close();
    // The page that was open all along agrees.
    await page.waitForSelector(alertRow(sid));
    assert.equal(await page.locator(alertRow(sid)).count(), 1);
  });

  test("Inspect from a fleet node shows the repeated command and its failure text", async () => {
    // Free-text intents, as LLM agents write them: the entropy ratio sees variety.
    const sid = "sess-pytest-node";
    await gateway.calls(sid, "agent-coder", pytestLoop(4));
    await page.waitForSelector(fleetNode(sid));
    await page.locator(fleetNode(sid)).getByRole("button", { name: "Inspect" }).click();
    await page.waitForSelector(`#inspector[data-session-id=${attr(sid)}]`);

    assert.equal(await page.getAttribute("#inspector", "data-paused"), "false", "Inspect does not pause");
    const why = await page.textContent("#inspector .why-verdict");
    assert.match(why, /pytest tests\/test_auth\.py -x/);
    assert.match(why, /4 times, the same failure/);
    assert.match(why, /Arguments: the same each time/);
    assert.match(await page.textContent("#inspector .why-verdict .excerpt"), /E {7}assert 401 == 200/);
    assert.equal(await page.locator('#inspector li.step[data-evidence="true"]').count(), 4);

    // A long result is cut to its head and tail; Show all gives it whole.
    const first = page.locator('#inspector li.step[data-step="1"]');
    assert.doesNotMatch(await first.locator("pre.step-result").textContent(), /def test_login_returns_token/);
    await first.getByRole("button", { name: "Show all" }).click();
    await page.waitForSelector('#inspector li.step[data-step="1"] button:has-text("Show less")');
    assert.match(await first.locator("pre.step-result").textContent(), /def test_login_returns_token/);
    await shot(page, "inspect-node.png", { fullPage: true });
    await page.locator("#inspector").getByRole("button", { name: "Close" }).click();
  });

  test("a paused row offers Resume, and Resume brings Pause and Inspect back", async () => {
    const sid = "sess-paused-row";
    await gateway.steps(sid, "agent-paused", loop(5));
    await page.waitForSelector(alertRow(sid));
    await gateway.pause(sid);

    const row = page.locator(alertRow(sid));
    await page.waitForSelector(`${alertRow(sid)} button:has-text("Resume")`);
    assert.equal(await row.getByRole("button", { name: "Pause and Inspect" }).count(), 0);
    assert.equal(await row.getByRole("button", { name: "Inspect", exact: true }).count(), 1);

    await row.getByRole("button", { name: "Resume" }).click();
    await page.waitForSelector(`${alertRow(sid)} button:has-text("Pause and Inspect")`);
    assert.equal((await gateway.session(sid)).body.paused, false);
  });

  test("the page reconnects by itself after the gateway restarts", async () => {
    const firstPage = await page.evaluate(() => document.body.dataset.pageId);
    await page.evaluate(() => {
      window.__notReloaded = true;
    });

    await gateway.stop();
    await page.waitForSelector('body[data-live="reconnecting"]');
    await shot(page, "reconnecting.png");
    await gateway.start();
    await page.waitForFunction(
      (old) => document.body.dataset.live === "live" && document.body.dataset.pageId !== old,
      firstPage,
      { timeout: 30_000 },
    );

    const sid = "sess-after-restart";
    await gateway.steps(sid, "agent-restarted", loop(5));
    await page.waitForSelector(alertRow(sid), { timeout: 2_000 });
    assert.equal(await page.evaluate(() => window.__notReloaded), true, "no reload happened");
  });

  test("at laptop width the fleet and the Inspect view read at a glance (README screenshot)", async () => {
    const fleet = [
      ["sess-crawler-2", "agent-crawler", loop(5)],
      ["sess-deploy-3", "agent-deploy", pingPong(5)],
      ["sess-research-1", "agent-research", healthy(5)],
      ["sess-research-4", "agent-research", healthy(3)],
      ["sess-support-9", "agent-support", healthy(4)],
    ];
    for (const [sid, agent, steps] of fleet) await gateway.steps(sid, agent, steps);
    await gateway.call("sess-billing-7", "agent-billing", {
      intent: "Read the failing test",
      tool: "read_file",
      input: { path: "tests/test_auth.py" },
      status: "success",
      result: "def test_login_returns_token(client):\n    ...",
    });
    await gateway.calls("sess-billing-7", "agent-billing", pytestLoop(5, ["Run the auth tests"]));
    await page.waitForSelector(alertRow("sess-billing-7"));
    await page.locator(alertRow("sess-billing-7")).getByRole("button", { name: "Pause and Inspect" }).click();
    await page.waitForSelector(`${fleetNode("sess-billing-7")}[data-state="paused"]`);
    await page.waitForSelector(`${fleetNode("sess-deploy-3")}[data-state="blocked"]`);
    await page.waitForSelector(`${fleetNode("sess-support-9")}[data-state="active"]`);
    await page.waitForSelector('#inspector[data-session-id="sess-billing-7"] .why-verdict');

    await page.setViewportSize({ width: 1440, height: 900 });
    await page.mouse.move(0, 0);
    await page.emulateMedia({ reducedMotion: "reduce" });
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 1440, `no horizontal scroll at 1440 px (page is ${width} px wide)`);
    const table = await page.$eval(".table-wrap", (el) => [el.scrollWidth, el.clientWidth]);
    assert.ok(table[0] <= table[1], `the alerts table fits its panel (${table[0]} > ${table[1]})`);
    await shot(page, "dashboard.png", { fullPage: true });
    if (process.env.UPDATE_README_SCREENSHOT === "1") {
      await page.screenshot({ path: path.join(ROOT, "docs/dashboard.png"), fullPage: true });
    }
  });

  test("at 390×844 nothing scrolls sideways and each row's actions are in its card", async () => {
    for (const [sid, agent, steps] of [
      ["sess-phone-loop", "agent-with-a-rather-long-name-for-a-phone", loop(5)],
      ["sess-phone-ok", "agent-phone", healthy(3)],
    ]) await gateway.steps(sid, agent, steps);
    await gateway.calls("sess-phone-pytest", "agent-coder", pytestLoop(4));

    const phone = await context.browser().newContext({ viewport: { width: 390, height: 844 } });
    const p = await phone.newPage();
    await signIn(p);
    await p.waitForSelector(alertRow("sess-phone-loop"));
    await p.emulateMedia({ reducedMotion: "reduce" });

    const overflow = () => p.evaluate(() => document.documentElement.scrollWidth);
    assert.ok((await overflow()) <= 390, `no sideways scroll (page is ${await overflow()} px wide)`);

    // Every row's buttons sit inside its card, on screen.
    for (const row of await p.locator("tr.alert-row").all()) {
      const box = await row.boundingBox();
      for (const button of await row.locator("button").all()) {
        const b = await button.boundingBox();
        assert.ok(b.x >= box.x && b.x + b.width <= box.x + box.width + 0.5, "the button is in its row");
        assert.ok(b.y >= box.y && b.y + b.height <= box.y + box.height + 0.5, "the button is in its row");
        assert.ok(b.x + b.width <= 390, "the button is on screen");
      }
    }
    await shot(p, "phone.png", { fullPage: true });

    // Inspect from a node at the bottom: the panel is scrolled into view, and its long
    // lines (commands, failures) wrap instead of widening the page.
    await p.locator(fleetNode("sess-phone-pytest")).getByRole("button", { name: "Inspect" }).click();
    await p.waitForSelector(`#inspector[data-session-id="sess-phone-pytest"]`);
    await p.waitForFunction(() => {
      const top = document.getElementById("inspector").getBoundingClientRect().top;
      return top >= -1 && top < window.innerHeight;
    });
    assert.ok((await overflow()) <= 390, `no sideways scroll with Inspect open (${await overflow()} px)`);
    await shot(p, "phone-inspect.png");
    await phone.close();
  });
});
