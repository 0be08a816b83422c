// Cosmos3 nodes in the ComfyUI front end:
// - a read-only report under the loader, text encode, sampler and control nodes (detected variant, resolved
//   settings, one note per line), refreshed after every run, cached runs included;
// - when a workflow is opened, a notice for every Cosmos3 checkpoint it names that is not installed,
//   with where to download it (the loader node's `properties.models`).
import { app } from "../../scripts/app.js";

const REPORTING_NODES = new Set(["Cosmos3ModelLoader", "Cosmos3TextEncode", "Cosmos3Sampler", "Cosmos3TransferSampler",
  "Cosmos3EdgeControl", "Cosmos3BlurControl", "Cosmos3DepthControl", "Cosmos3SegmentationControl",
  "Cosmos3WorldScenarioMapControl", "Cosmos3Reason", "Cosmos3UpsamplePrompt"]);
const REPORT = "cosmos3_report";
const LINE_PX = 17;
const MAX_LINES = 5; // longer reports scroll inside the box instead of growing the node over its neighbours

function reportWidget(node) {
  let widget = node.widgets?.find((w) => w.name === REPORT);
  if (widget) return widget;
  const box = document.createElement("div");
  Object.assign(box.style, {
    whiteSpace: "pre-wrap", overflowY: "auto", fontSize: "12px", lineHeight: `${LINE_PX}px`,
    fontFamily: "monospace", color: "var(--input-text, #ddd)", background: "var(--comfy-input-bg, #222)",
    borderRadius: "4px", padding: "2px 6px", boxSizing: "border-box",
  });
  widget = node.addDOMWidget(REPORT, "cosmos3-report", box, {
    serialize: false, // never part of widgets_values or the API prompt
    getValue: () => box.textContent,
    setValue: (text) => { box.textContent = text; },
    getMinHeight: () => LINE_PX * Math.min(MAX_LINES, box.textContent.split("\n").length + 1) + 6, // +1: wrapped lines
    getMaxHeight: () => LINE_PX * MAX_LINES + 6,
  });
  widget.serialize = false;
  return widget;
}

function showReport(node, lines) {
  const widget = reportWidget(node);
  widget.value = lines.join("\n");
  widget.element.textContent = widget.value;
  const needed = node.computeSize([node.size[0], node.size[1]]);
  node.setSize([Math.max(node.size[0], needed[0]), Math.max(node.size[1], needed[1])]);
  node.setDirtyCanvas(true, true);
}

function missingCheckpoints(graph) {
  const missing = [];
  for (const node of graph?.nodes ?? []) {
    if (node.type !== "Cosmos3ModelLoader") continue;
    const widget = node.widgets?.find((w) => w.name === "model_name");
    const installed = widget?.options?.values ?? [];
    if (!widget || installed.includes(widget.value)) continue;
    const url = node.properties?.models?.find((m) => m.name === widget.value)?.url;
    missing.push({ node, name: widget.value, url });
  }
  return missing;
}

function flagMissing(graph) {
  const missing = missingCheckpoints(graph);
  for (const { node, name, url } of missing) {
    const folder = name.split("/").pop();
    showReport(node, [
      `checkpoint not installed: ${name}`,
      url ? `download: ${url}` : "download the diffusers folder (with model_index.json)",
      `into ComfyUI/models/cosmos3/${folder}/, then press R to refresh`,
    ]);
  }
  if (missing.length && app.extensionManager?.toast) {
    app.extensionManager.toast.add({
      severity: "warn",
      summary: "Cosmos3: checkpoint not installed",
      detail: missing.map((m) => `${m.name}${m.url ? ` (${m.url})` : ""}`).join(", ") +
        " — put the folder in ComfyUI/models/cosmos3/",
      life: 10000,
    });
  }
}

app.registerExtension({
  name: "cosmos3.NodeReports",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!REPORTING_NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (message?.text?.length) showReport(this, message.text);
    };
  },
  async afterConfigureGraph() {
    flagMissing(app.graph);
  },
});
