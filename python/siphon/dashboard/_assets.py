"""The dashboard's inline CSS and JavaScript (vanilla, no network): the pages open from
``file://`` without a server, so data comes in ``<script>`` elements, not fetch()."""

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.2em 2em; color: #1d1d1f; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.4em; } h3 { font-size: 1em; margin: 1em 0 .3em; }
a { color: #1558b0; text-decoration: none; } a:hover { text-decoration: underline; }
table { border-collapse: collapse; font-size: .9em; }
th, td { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
th { background: #f5f5f7; position: sticky; top: 0; user-select: none; }
th[data-key] { cursor: pointer; }
th.sorted-asc::after { content: " \\25B2"; } th.sorted-desc::after { content: " \\25BC"; }
td.tokens, th.tokens, td.token { text-align: left; }
.muted, caption, .caption { color: #6e6e73; font-size: .85em; }
caption { caption-side: bottom; text-align: left; padding-top: .3em; }
#filter { font-size: 1em; padding: 3px 6px; width: 24em; margin: .5em 0; }
.example { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .85em;
  line-height: 1.9; margin: 1px 0; padding: 1px 4px; border-bottom: 1px solid #f2f2f2; overflow-wrap: anywhere; }
.example .value { display: inline-block; min-width: 5.5em; color: #6e6e73; }
.tok { white-space: pre; border-radius: 2px; padding: 1px 0; }
.tok.own { outline: 2px solid #1558b0; outline-offset: 0; }
.sym { color: #8e8e93; }
.bar { fill: #4a7fd0; } .bar:hover { fill: #1558b0; }
.axis { font-size: 10px; fill: #6e6e73; }
dl.stats { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; }
dl.stats dt { color: #6e6e73; } dl.stats dd { margin: 0; }
nav a { margin-right: 1em; }
.effects { display: flex; gap: 3em; flex-wrap: wrap; align-items: flex-start; }
.token { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: pre; }
#status { color: #b3261e; }
"""

#: Shared helpers: HTML escaping, token display, number formatting.
COMMON_JS = r"""
function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}
// A token string as shown: leading-space markers (GPT-2's U+0120, SentencePiece's U+2581) as
// a space (shown: tokens are white-space: pre), newlines as a return symbol, tabs as an arrow.
function showToken(s) {
  return String(s).replace(/[\u0120\u2581]/g, " ").replace(/\r\n|\n|\u010A/g, "\u23CE")
    .replace(/\r/g, "\u240D").replace(/\t|\u0109/g, "\u21E5");
}
function fmt(v) {
  if (v === null || v === undefined) return "\u2013";
  if (v === 0) return "0";
  return Number(v.toPrecision(5)).toString();
}
// Widens each SVG's viewBox (and its size with it) to hold all it draws, a pixel to spare: an
// axis label at an edge (the last bin's, a large count) is shown whole, not cut off there.
function fitSvgs() {
  var svgs = document.querySelectorAll("svg");
  for (var i = 0; i < svgs.length; i++) {
    var svg = svgs[i], box = svg.getBBox(), view = svg.viewBox.baseVal;
    if (!box.width || !box.height) continue;
    var x0 = Math.min(view.x, Math.floor(box.x) - 1), y0 = Math.min(view.y, Math.floor(box.y) - 1);
    var x1 = Math.max(view.x + view.width, Math.ceil(box.x + box.width) + 1);
    var y1 = Math.max(view.y + view.height, Math.ceil(box.y + box.height) + 1);
    svg.setAttribute("viewBox", x0 + " " + y0 + " " + (x1 - x0) + " " + (y1 - y0));
    svg.setAttribute("width", x1 - x0);
    svg.setAttribute("height", y1 - y0);
  }
}
"""

#: The column index: the table of every latent, sortable and filterable.
COLUMN_JS = COMMON_JS + r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("latents").textContent);
  var n = data.latent.length, rows = new Array(n);
  for (var i = 0; i < n; i++) {
    var toks = data.top_tokens[i], text = [], plain = [];
    for (var t = 0; t < toks.length; t++) {
      text.push('<span class="token">' + esc(showToken(toks[t][0])) + '</span> <span class="muted">\u00D7' + toks[t][1] + "</span>");
      plain.push(showToken(toks[t][0]).toLowerCase());
    }
    // A latent that never fired has no largest or mean activation (stats.json's 0s).
    var fired = data.firings[i] > 0;
    rows[i] = {latent: data.latent[i], frequency: data.frequency[i], max: fired ? data.max[i] : null,
               mean: fired ? data.mean[i] : null, firings: data.firings[i], top_tokens: plain.join(" "),
               html: text.join(", ")};
  }
  var body = document.querySelector("#table tbody"), filter = document.getElementById("filter");
  var shown = document.getElementById("shown"), key = "latent", dir = 1;
  function matches(r, q) {
    if (!q) return true;
    if (/^\d+$/.test(q)) return String(r.latent) === q || r.top_tokens.indexOf(q) >= 0;
    return r.top_tokens.indexOf(q) >= 0;
  }
  function draw() {
    var q = filter.value.trim().toLowerCase(), picked = rows.filter(function (r) { return matches(r, q); });
    picked.sort(function (a, b) {
      var x = a[key], y = b[key];
      if (x === null) x = -Infinity; if (y === null) y = -Infinity;
      return (x < y ? -1 : x > y ? 1 : 0) * dir || a.latent - b.latent;
    });
    var html = [];
    for (var i = 0; i < picked.length; i++) {
      var r = picked[i];
      html.push('<tr data-latent="' + r.latent + '"><td><a href="latent.html#' + r.latent + '">' + r.latent +
        '</a></td><td>' + fmt(r.frequency) + "</td><td>" + fmt(r.max) + "</td><td>" + fmt(r.mean) +
        "</td><td>" + r.firings + '</td><td class="tokens">' + r.html + "</td></tr>");
    }
    body.innerHTML = html.join("");
    shown.textContent = picked.length + " of " + n + " latents";
    var heads = document.querySelectorAll("#table th[data-key]");
    for (var h = 0; h < heads.length; h++) {
      heads[h].className = heads[h].getAttribute("data-key") === key ? (dir > 0 ? "sorted-asc" : "sorted-desc") : "";
    }
  }
  document.querySelector("#table thead").addEventListener("click", function (e) {
    var th = e.target.closest("th[data-key]");
    if (!th) return;
    var k = th.getAttribute("data-key");
    if (k === key) dir = -dir; else { key = k; dir = k === "latent" || k === "top_tokens" ? 1 : -1; }
    draw();
  });
  var timer = null;
  filter.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(draw, 120); });
  draw();
  fitSvgs();
})();
"""

#: The latent page: one page for every latent, the latent in location.hash.
LATENT_JS = COMMON_JS + r"""
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("column").textContent);
  var chunks = {}, requested = {}, vocab = null;
  var main = document.getElementById("latent"), status = document.getElementById("status");
  window.siphonVocab = function (v) { vocab = v; };
  window.siphonChunk = function (start, latents) { chunks[Math.floor(start / config.chunk)] = latents; render(); };
  function tokenText(id) {
    return vocab !== null && id >= 0 && id < vocab.length ? vocab[id] : "#" + id;
  }
  // The address's latent: "#12" is 12, no hash latent 0; anything else (null) is none.
  function current() {
    var hash = location.hash.replace(/^#/, "");
    if (hash === "") return 0;
    return /^[0-9]+$/.test(hash) ? parseInt(hash, 10) : null;
  }
  function asked() {
    var hash = location.hash.replace(/^#/, "");
    try { return decodeURIComponent(hash); } catch (e) { return hash; }
  }
  function chunkFile(c) { return "data/chunk-" + ("000" + c).slice(-Math.max(4, String(c).length)) + ".js"; }
  function load(c) {
    if (requested[c]) return;
    requested[c] = true;
    var s = document.createElement("script");
    s.src = chunkFile(c);
    s.onerror = function () { status.textContent = "could not load " + chunkFile(c); };
    document.head.appendChild(s);
  }
  function colour(v, max) {
    var a = max > 0 ? Math.max(0, Math.min(1, v / max)) : 0;
    return a > 0 ? "background-color:rgba(255,110,20," + a.toFixed(3) + ")" : "";
  }
  function example(e, max) {
    var out = ['<div class="example" data-value="' + fmt(e.value) + '" data-row="' + e.row + '" data-doc="' + e.doc +
               '" data-position="' + e.position + '"><span class="value">' + fmt(e.value) + "</span>"];
    for (var i = 0; i < e.tokens.length; i++) {
      if (e.tokens[i] < 0) continue;
      var v = e.values[i] === null ? 0 : e.values[i], text = esc(showToken(tokenText(e.tokens[i])));
      out.push('<span class="tok' + (i === config.window ? " own" : "") + '" data-id="' + e.tokens[i] +
               '" data-value="' + fmt(v) + '" title="' + fmt(v) + '" style="' + colour(v, max) + '">' + text + "</span>");
    }
    out.push("</div>");
    return out.join("");
  }
  function examples(list, max) {
    if (!list.length) return '<p class="muted">none</p>';
    return list.map(function (e) { return example(e, max); }).join("");
  }
  // counts: bar heights of equal bins from range[0] to range[1] (the last one closed).
  function histogram(id, title, counts, range) {
    var W = 640, H = 150, left = 40, bottom = 28, bins = counts.length, top = Math.max.apply(null, counts.concat([1]));
    var from = range[0], width = (range[1] - range[0]) / bins;
    var bw = (W - left - 10) / bins, out = ['<svg id="' + id + '" width="' + W + '" height="' + H +
      '" viewBox="0 0 ' + W + " " + H + '" role="img"><title>' + title + "</title>"];
    for (var i = 0; i < bins; i++) {
      var lo = from + width * i, hi = from + width * (i + 1), h = (H - bottom - 8) * counts[i] / top;
      out.push('<rect class="bar" data-count="' + counts[i] + '" data-lo="' + fmt(lo) + '" data-hi="' + fmt(hi) +
               '" x="' + (left + i * bw).toFixed(1) + '" y="' + (H - bottom - h).toFixed(1) + '" width="' +
               Math.max(bw - 1, 1).toFixed(1) + '" height="' + h.toFixed(1) + '"><title>[' + fmt(lo) + ", " + fmt(hi) +
               (i === bins - 1 ? "]" : ")") + ": " + counts[i] + "</title></rect>");
    }
    var step = Math.max(1, Math.ceil(bins / 5));
    for (var e = 0; e <= bins; e += step) out.push(edge(e));
    if (bins % step) out.push(edge(bins));
    function edge(e) {
      return '<text class="axis edge" x="' + (left + e * bw).toFixed(1) + '" y="' + (H - bottom + 14) +
             '" text-anchor="middle">' + fmt(from + width * e) + "</text>";
    }
    out.push('<text class="axis" x="' + (left - 4) + '" y="12" text-anchor="end">' + top + "</text>");
    out.push('<text class="axis" x="' + (left - 4) + '" y="' + (H - bottom) + '" text-anchor="end">0</text></svg>');
    return out.join("");
  }
  function pairs(id, list, head, link) {
    var out = ['<table id="' + id + '"><thead><tr><th class="tokens">' + head + "</th><th>" +
               (link ? "cosine" : "logit") + "</th></tr></thead><tbody>"];
    for (var i = 0; i < list.length; i++) {
      var label = link ? '<a href="latent.html#' + list[i][0] + '">' + list[i][0] + "</a>"
                       : esc(showToken(tokenText(list[i][0])));
      out.push('<tr data-id="' + list[i][0] + '" data-value="' + fmt(list[i][1]) + '"><td class="token">' + label +
               "</td><td>" + fmt(list[i][1]) + "</td></tr>");
    }
    out.push("</tbody></table>");
    return out.join("");
  }
  function render() {
    var n = current();
    if (n === null || n >= config.width) {
      document.title = config.name + ": no latent " + asked();
      status.textContent = "no latent " + asked() + " (latents are 0.." + (config.width - 1) + ")";
      main.innerHTML = "";
      return;
    }
    document.title = config.name + " latent " + n;
    var c = Math.floor(n / config.chunk);
    if (!chunks[c]) { status.textContent = "loading latent " + n + "\u2026"; load(c); return; }
    var d = chunks[c][n - c * config.chunk];
    status.textContent = "";
    var html = ['<nav id="nav">' + (n > 0 ? '<a id="prev" href="latent.html#' + (n - 1) + '">\u2190 ' + (n - 1) + "</a>" : "") +
      (n + 1 < config.width ? '<a id="next" href="latent.html#' + (n + 1) + '">' + (n + 1) + " \u2192</a>" : "") +
      '<a href="index.html">all latents</a></nav>',
      '<h1 id="title" data-latent="' + n + '">Latent ' + n + "</h1>",
      '<dl class="stats" id="stats"><dt>frequency</dt><dd data-key="frequency">' + fmt(d.frequency) +
      '</dd><dt>firings</dt><dd data-key="firings">' + d.firings + "</dd>" + (d.firings > 0 ?
        '<dt>max</dt><dd data-key="max">' + fmt(d.max) + '</dd><dt>mean over firings</dt><dd data-key="mean">' +
        fmt(d.mean) + "</dd>" : "") + "</dl>"];
    // A latent that never fired has no activations: said once, instead of an empty histogram
    // and empty ranges (its decoder's effects below still hold).
    if (d.firings > 0) {
      html.push("<h2>Activations</h2>" + histogram("histogram", "activations of latent " + d.latent, d.hist, d.hist_range));
    } else {
      html.push('<p id="never-fired">Latent ' + n + " never fired on the run's " + config.count +
                " tokens: it has no activations to show.</p>");
    }
    if (d.logits_top || d.logits_bottom) {
      html.push('<h2>Logit effects</h2><div class="effects" id="logits">' +
        (d.logits_top ? "<div><h3>top</h3>" + pairs("logits-top", d.logits_top, "token", false) + "</div>" : "") +
        (d.logits_bottom ? "<div><h3>bottom</h3>" + pairs("logits-bottom", d.logits_bottom, "token", false) + "</div>" : "") +
        "</div>" + (d.logits_hist ? '<h3 id="logits-histogram-heading">Logit effects over the vocabulary</h3>' +
          histogram("logits-histogram", "logit effects over the vocabulary", d.logits_hist.heights, d.logits_hist.range) : ""));
    }
    if (d.neighbours) html.push('<h2>Nearest latents (decoder cosine)</h2><div id="neighbours">' +
      pairs("neighbours-table", d.neighbours, "latent", true) + "</div>");
    if (d.firings > 0) {
      html.push('<section id="top"><h2>Top activations</h2>' + examples(d.top, d.max) + "</section>");
      for (var q = 0; q < d.ranges.length; q++) {
        var r = d.ranges[q];
        html.push('<section class="range" data-range="' + r.range + '" data-lo="' + fmt(r.lo) + '" data-hi="' + fmt(r.hi) +
          '"><h3>range ' + r.range + ": (" + fmt(r.lo) + ", " + fmt(r.hi) + "]</h3>" + examples(r.examples, d.max) + "</section>");
      }
    }
    main.innerHTML = html.join("");
    fitSvgs();
    var next = c + 1;
    if (next * config.chunk < config.width && n % config.chunk > config.chunk - 8) load(next);
  }
  window.addEventListener("hashchange", function () { render(); window.scrollTo(0, 0); });
  if (config.vocab) {
    var s = document.createElement("script");
    s.src = "../vocab.js";
    s.onload = render;
    s.onerror = function () { status.textContent = "could not load ../vocab.js"; render(); };
    document.head.appendChild(s);
  } else {
    render();
  }
})();
"""
