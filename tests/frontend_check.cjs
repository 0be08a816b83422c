// Opens every UI workflow in a running ComfyUI's real front end (headless Chromium) and prints, as one
// JSON line: the front end's own API conversion of each (app.graphToPrompt), the page errors seen
// while it loaded, the zoom the template browser's fit-to-view gives it, the report text a workflow with a missing
// checkpoint gets on its loader, the answer the Reasoner workflow shows when it is queued from the page, and what
// the node search lists for a few queries.
// Usage: node frontend_check.cjs URL WORKFLOW_DIR SCREENSHOT_DIR  (NODE_PATH must reach playwright-core;
// CHROMIUM names the browser). Run by tests/test_comfyui_server.py.
const fs = require("fs");
const path = require("path");
const { chromium } = require("playwright-core");

const [url, workflowDir, shotDir] = process.argv.slice(2);

async function main() {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  let errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  page.on("console", (message) => {
    if (message.type() === "error" && !/favicon|Failed to load resource/.test(message.text())) errors.push(message.text());
  });
  await page.goto(url);
  await page.waitForFunction(() => window.app && window.app.graph && window.app.extensionManager, null, { timeout: 60000 });
  await page.waitForTimeout(2000);
  await page.keyboard.press("Escape"); // the first-run template browser
  await page.waitForTimeout(500);
  const report = { converted: {}, errors: {}, template_scale: {}, missing_notice: "" };
  const names = fs.readdirSync(workflowDir).filter((f) => f.endsWith(".json")).sort();
  for (const file of names) {
    const name = path.basename(file, ".json");
    const workflow = JSON.parse(fs.readFileSync(path.join(workflowDir, file), "utf8"));
    errors = [];
    await page.evaluate(async ([w, n]) => { await window.app.loadGraphData(w, true, true, n); }, [workflow, name]);
    await page.waitForTimeout(1500);
    await page.screenshot({ path: path.join(shotDir, `${name}.png`) });
    report.converted[name] = await page.evaluate(async () => (await window.app.graphToPrompt()).output);
    report.errors[name] = errors;
    // As the template browser opens it: the front end fits the view to the nodes.
    await page.evaluate(async ([w, n]) => {
      await window.app.loadGraphData(w, true, true, n, { openSource: "template" });
    }, [workflow, `${name} (template)`]);
    await page.waitForTimeout(1000);
    report.template_scale[name] = await page.evaluate(() => window.app.canvas.ds.scale);
    if (name === "cosmos3_edge_t2v") await page.screenshot({ path: path.join(shotDir, `${name}_template.png`) });
  }
  const missing = JSON.parse(fs.readFileSync(path.join(workflowDir, "cosmos3_edge_t2v.json"), "utf8"));
  const loader = missing.nodes.find((n) => n.type === "Cosmos3ModelLoader");
  loader.widgets_values[0] = "Cosmos3-Missing";
  loader.properties.models = [{ name: "Cosmos3-Missing", url: "https://example.invalid/Cosmos3-Missing", directory: "cosmos3" }];
  await page.evaluate(async (w) => { await window.app.loadGraphData(w, true, true, "missing"); }, missing);
  await page.waitForTimeout(1500);
  await page.screenshot({ path: path.join(shotDir, "missing_checkpoint.png") });
  report.missing_notice = await page.evaluate((id) => {
    const node = window.app.graph.getNodeById(id);
    return node.widgets.find((w) => w.name === "cosmos3_report")?.value ?? "";
  }, loader.id);
  // The Reasoner workflow queued from the front end (8 new tokens): the answer shows in the Reason node's report
  // and in Preview Any.
  const reasoning = JSON.parse(fs.readFileSync(path.join(workflowDir, "cosmos3_nano_reason_image.json"), "utf8"));
  const reason = reasoning.nodes.find((n) => n.type === "Cosmos3Reason");
  const preview = reasoning.nodes.find((n) => n.type === "PreviewAny");
  reason.widgets_values[2] = 8; // max_new_tokens
  await page.evaluate(async (w) => { await window.app.loadGraphData(w, true, true, "reason"); }, reasoning);
  await page.waitForTimeout(1000);
  await page.evaluate(async () => { await window.app.queuePrompt(0, 1); });
  await page.waitForFunction((id) => window.app.graph.getNodeById(id).widgets.find((w) => w.name === "cosmos3_report")?.value,
    reason.id, { timeout: 180000 });
  await page.waitForTimeout(1000);
  [report.reason_report, report.reason_preview] = await page.evaluate(([r, p]) => [
    window.app.graph.getNodeById(r).widgets.find((w) => w.name === "cosmos3_report").value,
    window.app.graph.getNodeById(p).widgets?.find((w) => w.type !== "button")?.value ?? "",
  ], [reason.id, preview.id]);
  await page.screenshot({ path: path.join(shotDir, "reason_answer.png") });
  // The node search, as a user opens it (double click on an empty canvas): what a query lists.
  report.search = {};
  for (const term of ["Cosmos3 Core Model", "Cosmos3 API"]) {
    await page.evaluate(() => window.app.graph.clear());
    await page.waitForTimeout(300);
    await page.mouse.dblclick(800, 500);
    await page.waitForTimeout(800);
    await page.keyboard.type(term);
    await page.waitForTimeout(1500);
    report.search[term] = await page.evaluate(() =>
      [...document.querySelectorAll('[role="option"]')].map((o) => o.innerText.replace(/\s+/g, " ").trim()));
    await page.screenshot({ path: path.join(shotDir, `search_${term.replace(/ /g, "_")}.png`) });
    await page.keyboard.press("Escape");
    await page.waitForTimeout(300);
  }
  await browser.close();
  console.log(JSON.stringify(report));
}

main().catch((error) => { console.error(error); process.exit(1); });
