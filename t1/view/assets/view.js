// T1 view: draws the run page's charts (plotly.js, served from the installed plotly package), shows a
// token's details on hover, and reloads the page every 5 s while "follow" is ticked.
"use strict";

function drawCharts() {
  const data = document.getElementById("charts-data");
  if (!data || typeof Plotly === "undefined") return Promise.resolve();
  const charts = JSON.parse(data.textContent);
  const drawn = charts.filter((c) => c.series.length).map((c) => {
    const traces = c.series.map((s) => ({ x: s.x, y: s.y, name: s.name, type: "scatter", mode: "lines+markers" }));
    const layout = {
      title: { text: c.title, font: { size: 13 } }, margin: { l: 48, r: 12, t: 32, b: 64 },
      xaxis: { title: { text: c.x_label, standoff: 4 } }, showlegend: c.series.length > 1,
      legend: { orientation: "h", yanchor: "top", y: -0.32, font: { size: 11 } },
    };
    return Plotly.newPlot("chart-" + c.key, traces, layout, { displayModeBar: false, responsive: true });
  });
  return Promise.all(drawn);
}

function showToken(el) {
  const info = document.getElementById("tokinfo");
  if (!info) return;
  const d = el.dataset;
  const role = el.className.replace("tok role-", "");
  const parts = ["pos " + d.p, "id " + d.id, "text " + JSON.stringify(el.textContent), role,
    "logprob " + (d.lp === "" ? "-" : Number(d.lp).toFixed(4)), "version " + (d.v === "-1" ? "-" : d.v),
    "routing " + (d.r === "" ? "-" : Math.round(Number(d.r) * 100) + "% of layers")];
  info.textContent = parts.join(" | ");
}

function follow() {
  const box = document.getElementById("follow");
  if (!box) return;
  box.checked = localStorage.getItem("t1-follow") === "1";
  box.addEventListener("change", () => {
    localStorage.setItem("t1-follow", box.checked ? "1" : "0");
    if (box.checked) location.reload();
  });
  if (box.checked) setTimeout(() => location.reload(), 5000);
}

document.addEventListener("mouseover", (ev) => {
  const el = ev.target;
  if (el instanceof HTMLElement && el.classList.contains("tok") && el.dataset.p !== undefined) showToken(el);
});
follow();
window.t1Ready = drawCharts().then(() => { document.body.dataset.ready = "1"; });
