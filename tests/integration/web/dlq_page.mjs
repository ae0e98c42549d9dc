// Drives rebound's admin page (GET /) in headless Chromium against a running
// rebound whose dead-letter queue DLQ holds exactly one parked message:
// the intercepted queues table, a refused login, a login, the DLQ's
// message (body, reason "max-attempts", source queue), a dismissed purge
// (nothing sent), a redrive (1 moved, the DLQ then shows empty) and a purge
// of the empty DLQ (0 purged). The password must never appear in a URL, and
// the untrusted body must stay text.
//
//   node dlq_page.mjs ADMIN_URL USER PASSWORD DLQ [BODY [SOURCE_QUEUE]]
//
// BODY: the parked message's body (text) to find on the page; SOURCE_QUEUE:
// the queue it came from, expected in the intercepted queues table and as
// the message's source queue. Exit 0: every check passed; 1: a check
// failed (the reason on stderr); 2: usage.
import { chromium } from "playwright-core";

const [base, user, password, dlq, body, source] = process.argv.slice(2);
if (!dlq) {
  console.error("usage: node dlq_page.mjs ADMIN_URL USER PASSWORD DLQ [BODY [SOURCE_QUEUE]]");
  process.exit(2);
}
const root = base.replace(/\/+$/, "") + "/";
const executablePath = process.env.REBOUND_CHROMIUM || "/usr/bin/chromium";

function check(ok, what) {
  if (!ok) throw new Error(what);
}

const text = (page, sel) => page.locator(sel).textContent();

// The text of the status line once it has settled on `kind` ("ok" or
// "error").
async function statusWhen(page, kind) {
  await page.waitForSelector(`#status.${kind}`);
  return text(page, "#status");
}

async function dlqRow(page) {
  return page.waitForSelector(`#dlqs tr[data-queue=${JSON.stringify(dlq)}]`);
}

// Waits until the chosen DLQ's row shows `n` messages and the message list
// holds `n` .message elements.
async function waitShown(page, n) {
  await page.waitForFunction(
    ([name, n]) => {
      const rows = [...document.querySelectorAll("#dlqs tr[data-queue]")];
      const row = rows.find((r) => r.dataset.queue === name);
      const shown = document.querySelectorAll("#messages .message").length;
      return row && row.cells[1].textContent.trim() === String(n) && shown === n;
    },
    [dlq, n],
  );
}

async function run(page, requests, pageErrors) {
  const res = await page.goto(root);
  check(res.status() === 200, `GET / answered ${res.status()}`);
  const type = res.headers()["content-type"] || "";
  check(/^text\/html/.test(type), `GET / is ${type}, not text/html`);

  // the intercepted queues, without logging in
  await page.waitForSelector("#queues tbody tr");
  if (source) {
    await page.waitForFunction(
      (name) => [...document.querySelectorAll("#queues tbody tr")].some((r) => r.cells[0].textContent === name),
      source,
    );
  }

  // a wrong password: the broker refuses it, the status line says so
  await page.fill("#user", user);
  await page.fill("#password", password + "-wrong");
  await page.fill("#vhost", "/");
  await page.click("#login");
  const refused = await statusWhen(page, "error");
  check(/\b403\b/.test(refused), `a wrong password should show a 403 in #status, it shows: ${refused}`);
  check((await page.locator("#dlqs tr[data-queue]").count()) === 0, "DLQs listed after a refused login");

  // the right one: the DLQ is listed with its one message
  await page.fill("#password", password);
  await page.click("#login");
  const row = await dlqRow(page);
  await statusWhen(page, "ok");
  const count = (await row.$$eval("td", (tds) => tds.map((td) => td.textContent.trim())))[1];
  check(count === "1", `${dlq} should list 1 message, it lists ${count}`);

  // choose it: the parked message, shown as text
  await row.click();
  await waitShown(page, 1);
  const shown = await text(page, "#messages .message");
  check(shown.includes("max-attempts"), `the message does not show reason max-attempts: ${shown}`);
  if (body) {
    const pre = await text(page, "#messages .message pre");
    check(pre.includes(body), `the message does not show its body ${JSON.stringify(body)}: ${shown}`);
  }
  if (source) check(shown.includes(source), `the message does not show its source queue ${source}: ${shown}`);
  check((await page.locator("#messages .message pre *").count()) === 0, "markup in the message body became elements");

  // purge, dismissed: nothing is sent
  page.once("dialog", (d) => d.dismiss());
  const before = requests.length;
  await page.click("#purge");
  check(!/purge/i.test(await text(page, "#status")), "a dismissed purge started");
  check(!requests.slice(before).some((r) => r.url.includes("/purge")), "a dismissed purge was sent");
  check((await page.locator("#messages .message").count()) === 1, "the message went after a dismissed purge");

  // redrive: 1 moved, and the DLQ shows empty
  await page.click("#redrive");
  await page.waitForFunction(() => document.querySelector("#result").textContent.includes("moved"));
  const redrive = JSON.parse(await text(page, "#result"));
  check(
    redrive.moved === 1 && redrive.not_moved === 0,
    `redrive result ${JSON.stringify(redrive)}, expected 1 moved, 0 not moved`,
  );
  const redriven = await statusWhen(page, "ok");
  check(redriven.includes("moved 1"), `#status after the redrive: ${redriven}`);
  await waitShown(page, 0);

  // purge, confirmed, of the now empty DLQ
  let asked = "";
  page.once("dialog", (d) => {
    asked = d.message();
    d.accept();
  });
  await page.click("#purge");
  await page.waitForFunction(() => document.querySelector("#result").textContent.includes("purged"));
  const purge = JSON.parse(await text(page, "#result"));
  check(purge.purged === 0, `purge of the empty DLQ: ${JSON.stringify(purge)}`);
  check(asked.includes(dlq), `the purge confirmation does not name ${dlq}: ${asked}`);
  await waitShown(page, 0);

  // the credentials went in the Authorization header only
  const api = requests.filter((r) => new URL(r.url).pathname.startsWith("/v1/dlq"));
  check(api.length >= 5, `only ${api.length} /v1/dlq requests seen`);
  for (const r of api) {
    check(/^Basic /.test(r.auth || ""), `${r.method} ${r.url} without Basic authorization`);
    check(new URL(r.url).searchParams.get("vhost") === "/", `${r.method} ${r.url}: vhost not "/"`);
  }
  for (const r of requests) check(!r.url.includes(password), `the password is in a URL: ${r.url}`);
  check(!page.url().includes(password), `the password is in the page's URL: ${page.url()}`);
  check(pageErrors.length === 0, `errors in the page: ${pageErrors.join("; ")}`);
  return { redrive, purge, requests: requests.length };
}

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
const page = await browser.newPage();
page.setDefaultTimeout(20000);
const requests = [];
const pageErrors = [];
page.on("request", (r) => requests.push({ method: r.method(), url: r.url(), auth: r.headers().authorization }));
page.on("pageerror", (e) => pageErrors.push(e.message));
let code = 0;
try {
  const got = await run(page, requests, pageErrors);
  console.log(`dlq_page: ok: ${JSON.stringify(got)}`);
} catch (e) {
  code = 1;
  console.error(`dlq_page: FAILED: ${e.message}`);
  const status = await page.locator("#status").textContent().catch(() => "?");
  console.error(`#status: ${status}`);
  console.error(`requests:\n${requests.map((r) => `  ${r.method} ${r.url}`).join("\n")}`);
  const seen = await page.locator("body").innerText().catch(() => "?");
  console.error(`page text:\n${seen.slice(0, 4000)}`);
} finally {
  await browser.close();
}
process.exit(code);
