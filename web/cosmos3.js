// Shows what Cosmos3 nodes report (detected variant, resolved settings, notes about changed values)
// in a read-only text box on the node, after each run.
import { app } from "../../scripts/app.js";

const REPORTING_NODES = new Set(["Cosmos3ModelLoader", "Cosmos3TextEncode", "Cosmos3Sampler"]);
const WIDGET = "cosmos3_report";

app.registerExtension({
  name: "cosmos3.NodeReports",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!REPORTING_NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const lines = message?.text;
      if (!lines?.length) return;
      let widget = this.widgets?.find((w) => w.name === WIDGET);
      if (!widget) {
        widget = this.addWidget("text", WIDGET, "", () => {}, { serialize: false });
        widget.serialize = false; // never part of widgets_values or the API prompt
      }
      widget.value = lines.join(" | ");
      this.setDirtyCanvas(true, true);
    };
  },
});
