// Browser test of the dashboard: `orrery dashboard --run <recorded run>` serves the fixture,
// Debian's chromium (driven by playwright-core) loads the page, and the test checks that
//   - the page logs no console error and throws no exception,
//   - every chart of every panel (Pretraining, Reward, Rollout, Learner, Routing, Fleet) has data and draws
//     non-blank pixels,
//   - the routing heatmap has layers x experts cells,
//   - the fleet table lists every actor, and the status line calls the recorded run finished,
//   - switching the x axis to wall time redraws every chart.
// A full-page screenshot is kept in --out (a CTest artifact under the build directory).
//
// node dashboard_test.cjs --orrery BIN --run DIR --node-modules DIR --out DIR
//                         [--layers 4 --experts 16 --actors 5]
"use strict";
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

const PANELS = ["pretrain", "reward", "rollout", "learner", "routing", "fleet"];
const CHROMIUM = "/usr/bin/chromium";
const SKIP = 77;

function parseArgs() {
  const args = { layers: "4", experts: "16", actors: "5" };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) args[argv[i].replace(/^--/, "").replace("-", "_")] = argv[i + 1];
  for (const k of ["orrery", "run", "node_modules", "out"]) {
    if (!args[k]) throw new Error(`missing --${k.replace("_", "-")}`);
  }
  return args;
}

// Starts the dashboard and resolves with [process, url] once it prints its address.
function startDashboard(orrery, run) {
  return new Promise((resolve, reject) => {
    const proc = spawn(orrery, ["dashboard", "--run", run, "--port", "0", "--poll-seconds", "0.5"],
      { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    const timer = setTimeout(() => reject(new Error(`dashboard did not start: ${out}`)), 20000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/dashboard: (http:\/\/\S+)/);
      if (m) { clearTimeout(timer); resolve([proc, m[1]]); }
    });
    proc.stderr.on("data", (d) => { out += d; });
    proc.on("exit", (code) => { clearTimeout(timer); reject(new Error(`dashboard exited ${code}: ${out}`)); });
  });
}

async function main() {
  const args = parseArgs();
  if (!fs.existsSync(CHROMIUM)) {
    console.log(`SKIP: ${CHROMIUM} is not installed (scripts/setup.sh installs it)`);
    return SKIP;
  }
  const { chromium } = require(path.resolve(args.node_modules, "playwright-core"));
  fs.mkdirSync(args.out, { recursive: true });
  const failures = [];
  const check = (ok, what) => { console.log(`${ok ? "ok  " : "FAIL"} ${what}`); if (!ok) failures.push(what); };

  const [server, url] = await startDashboard(args.orrery, args.run);
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "orrery-chromium-"));
  let context;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 1000 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"],
      timeout: 60000,
    });
    const page = context.pages()[0] || await context.newPage();
    const errors = [];
    page.on("console", (msg) => { if (msg.type() === "error") errors.push(`console: ${msg.text()}`); });
    page.on("pageerror", (e) => errors.push(`exception: ${e.message}`));
    page.on("requestfailed", (r) => errors.push(`request failed: ${r.url()}`));

    await page.goto(url, { waitUntil: "load", timeout: 30000 });
    await page.waitForFunction(() => window.orreryDashboard && window.orreryDashboard.ready,
      null, { timeout: 30000 });

    const status = await page.evaluate(() => {
      const charts = {};
      for (const card of document.querySelectorAll(".chart-card")) {
        const canvas = card.querySelector(".uplot canvas");
        let inked = 0;
        if (canvas && canvas.width > 0) {
          const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
          for (let i = 3; i < px.length; i += 4) if (px[i] > 0) inked++;
        }
        const panel = card.closest("[data-panel]").dataset.panel;
        charts[card.dataset.chart] = { panel, inked, ...window.orreryDashboard.charts[card.dataset.chart] };
      }
      const cells = [...document.querySelectorAll('[data-role="load-heatmap"] .cell')];
      return {
        charts,
        cells: cells.length,
        layers: new Set(cells.map((c) => c.dataset.layer)).size,
        experts: new Set(cells.map((c) => c.dataset.expert)).size,
        biasCells: document.querySelectorAll('[data-role="bias-heatmap"] .cell').length,
        actors: document.querySelectorAll("#actors-table tbody tr").length,
        replayTables: document.querySelectorAll("#replay-table tbody tr").length,
        errors: window.orreryDashboard.errors,
      };
    });

    for (const panel of PANELS) {
      const charts = Object.entries(status.charts).filter(([, c]) => c.panel === panel);
      check(charts.length > 0, `panel ${panel} has charts (${charts.length})`);
      for (const [id, c] of charts) {
        check(c.points > 0 && c.inked > 500, `chart ${id}: ${c.points} points, ${c.inked} inked pixels`);
      }
    }
    const layers = Number(args.layers), experts = Number(args.experts);
    check(status.cells === layers * experts && status.layers === layers && status.experts === experts,
      `load heatmap has ${layers} x ${experts} cells (got ${status.cells}: ${status.layers} layers, ${status.experts} experts)`);
    check(status.biasCells === layers * experts, `QB bias heatmap has ${layers * experts} cells (got ${status.biasCells})`);
    check(status.actors === Number(args.actors), `fleet table lists ${args.actors} actors (got ${status.actors})`);
    check(status.replayTables > 0, `replay tables listed (${status.replayTables})`);
    // The recorded run ended long ago: the status line says so rather than "live".
    const statusText = await page.textContent("#status");
    check(statusText.includes("finished") && !statusText.includes("live"),
      `a finished run is not shown as live ("${statusText}")`);
    await page.screenshot({ path: path.join(args.out, "dashboard.png"), fullPage: true });

    // Wall-time axis: every chart is redrawn with data.
    await page.selectOption("#x-axis", "time");
    await page.waitForTimeout(300);
    const timeCharts = await page.evaluate(() => Object.values(window.orreryDashboard.charts));
    check(timeCharts.every((c) => c.points > 0), "every chart has data against wall time");
    // Moving the routing step slider back redraws the heatmap at that step.
    await page.$eval("#routing-step", (el) => { el.value = "0"; el.dispatchEvent(new Event("input")); });
    check(await page.textContent("#routing-step-label") === "0", "routing step slider selects step 0");
    // One live refresh cycle passes without errors.
    await page.waitForTimeout(2500);
    check(errors.length === 0 && status.errors.length === 0,
      `no console errors or exceptions${errors.length ? ": " + errors.join(" | ") : ""}`);
  } finally {
    if (context) await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
    server.removeAllListeners("exit");
    const exited = new Promise((resolve) => server.on("exit", (code) => resolve(code)));
    server.kill("SIGTERM");
    const code = await exited;
    check(code === 0, `dashboard exits 0 on SIGTERM (got ${code})`);
  }
  console.log(`${failures.length === 0 ? "PASS" : "FAIL"}: ${failures.length} failed checks; screenshot ${path.join(args.out, "dashboard.png")}`);
  return failures.length === 0 ? 0 : 1;
}

main().then((code) => process.exit(code), (e) => { console.error(`FAIL: ${e.stack || e}`); process.exit(1); });
