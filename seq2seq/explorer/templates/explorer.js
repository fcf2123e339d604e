"use strict";
// The attention explorer. Every number comes from the JSON block (page.py computes the
// maps, their head means and per-row numbers); this script only draws. Steps, layers and
// heads are numbered from 1 as on the command line. The state lives in one object, and
// every change goes through setState, which redraws and writes the URL hash.
window.onerror = function (message) {
  document.body.setAttribute("data-status", "error: " + message);
};
(function () {
  const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
  const $ = (id) => document.getElementById(id);
  const VIEWS = ["step", "heatmap", "lines", "model", "interventions", "tree"];
  const MAPS = ["attention", "influence"];
  const KINDS = ["cross", "encoder", "decoder"]; // which attention: records' names (kinds.py)
  // viridis at 0, 1/4, 1/2, 3/4, 1
  const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const MIN_CELL = 20, MAX_CELL = 36;
  const MASKED_GREY = "#d0d0d0"; // a masked cell in a thumbnail, too small to hatch
  // spec: the intervention shown, as "KIND:LAYER", "KIND:all" or "mask:N" (null: the first held);
  // node: the beam tree's node shown (null: the chosen hypothesis' last); alpha: the length
  // penalty the tree's endings are ranked by (null: the search's)
  const state = { sentence: 0, layer: 1, head: "mean", step: 1, view: "step", map: "attention",
    spec: null, kind: "cross", node: null, alpha: null };
  const tooltip = $("tooltip");

  function colour(t) {
    const x = Math.min(Math.max(t, 0), 1) * (STOPS.length - 1);
    const i = Math.min(Math.floor(x), STOPS.length - 2);
    const f = x - i;
    const c = STOPS[i].map((v, k) => Math.round(v + f * (STOPS[i + 1][k] - v)));
    return "rgb(" + c.join(",") + ")";
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function svgEl(tag, attrs) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.entries(attrs || {}).forEach(([k, v]) => e.setAttribute(k, v));
    return e;
  }

  function option(select, value, text) {
    const o = el("option", text);
    o.value = value;
    select.appendChild(o);
  }

  const prob = (p) => p.toFixed(4);
  const rec = () => DATA.records[state.sentence];
  const headIndex = (r) => (state.head === "mean" ? r.n_heads : state.head - 1);
  // One kind of attention of a record: its maps, query (row) and key (column) tokens.
  const cross = (r) => ({ name: "cross-attention", rows: r.tgt, cols: r.src, maps: r.maps,
    n_layers: r.n_layers, causal: false, axes: ["target (queries)", "source (keys)"] });
  const attentionOf = (r, kind) => (kind === "cross" ? cross(r) : r.self_attention[kind]);
  const shownKind = (r) => attentionOf(r, state.kind);
  // The heatmap, line and model views draw the chosen kind; the step-through, whose rows
  // are decoding steps reading the source, always cross-attention (its nearest layer).
  const crossLayer = (r) => Math.min(state.layer, r.n_layers);
  const crossMap = (r) => r.maps[crossLayer(r) - 1][headIndex(r)];
  const currentMap = (r) => shownKind(r).maps[state.layer - 1][headIndex(r)];
  // The map row step n belongs to: the step itself, or its word at word level.
  const currentRow = (r) => (r.step_rows ? r.step_rows[state.step - 1] : state.step - 1);
  // The row of ``kind``'s map that the current step is (-1: none): the encoder's rows are
  // not steps, and a word of the decoder's inputs is not the word its step wrote.
  function kindRow(r, kind) {
    if (kind === "cross") return currentRow(r);
    return kind === "decoder" && !r.step_rows ? state.step - 1 : -1;
  }
  function stepWeights(r) {
    const maps = r.step_maps || r.maps;
    return maps[crossLayer(r) - 1][headIndex(r)].w[state.step - 1];
  }

  // --- hover: key token, query token, weight (or what the map measures) -----------------
  // kind: the attention the hovered element draws (its container's data-kind).
  function showTip(event, r, i, j, w, measure, kind) {
    const a = attentionOf(r, kind || "cross");
    const [rowName, colName] = a.axes.map((t) => t.split(" (")[0]);
    const masked = a.causal && j > i;
    tooltip.textContent = colName + " " + (j + 1) + ": " + a.cols[j] + "  \u00b7  " + rowName +
      " " + (i + 1) + ": " + a.rows[i] + "  \u00b7  " + (masked ? "masked: never read" :
      (measure || "weight") + " " + Number(w).toFixed(4));
    tooltip.style.left = (event.clientX + 14) + "px";
    tooltip.style.top = (event.clientY + 14) + "px";
    tooltip.style.display = "block";
  }
  const hideTip = () => { tooltip.style.display = "none"; };
  document.addEventListener("mousemove", (event) => {
    const target = event.target.closest && event.target.closest("[data-i][data-j]");
    if (!target) {
      if (!event.target.closest || !event.target.closest("canvas")) hideTip();
      return;
    }
    const table = target.closest("table");
    const box = target.closest("[data-kind]");
    showTip(event, rec(), +target.dataset.i, +target.dataset.j, target.dataset.w,
      table && table.dataset.measure, box && box.dataset.kind);
  });

  // --- heatmap ------------------------------------------------------------------------
  // Cells are at least MIN_CELL px: one label per row and column then fits without
  // overlapping; past the page width the map scrolls instead of shrinking.
  function cellSize(n_cols, extra) {
    const avail = document.documentElement.clientWidth - 80 - extra;
    return Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(avail / n_cols)));
  }

  // kind: which attention's tokens label the map ("cross" for the influence map, whose rows
  // and columns are cross-attention's). numbers: columns beside the map, {head: [titles],
  // row: (i) => [texts]}, or null. measure: what a cell's value is, for the tooltip. A
  // causal map's cells right of the diagonal are masked: hatched, not coloured as 0.
  function drawHeatmap(table, r, kind, map, numbers, current, measure) {
    const a = attentionOf(r, kind), causal = a.causal && measure !== "drop (nats)";
    const labelWidth = 12 + 8 * Math.max(...a.rows.map((t) => t.length));
    const cell = cellSize(a.cols.length, labelWidth + (numbers ? 200 : 0));
    table.style.setProperty("--cell", cell + "px");
    table.dataset.measure = measure || "weight";
    table.dataset.kind = kind;
    table.textContent = "";
    const head = el("thead");
    const top = el("tr");
    const [rowName, colName] = a.axes.map((t) => t.split(" (")[0]);
    top.appendChild(el("th", rowName + " \u2193 / " + colName + " \u2192"));
    a.cols.forEach((t) => {
      const th = el("th", undefined, "src");
      th.appendChild(el("span", t));
      top.appendChild(th);
    });
    if (numbers) {
      top.appendChild(el("td", "", "sep"));
      numbers.head.forEach((t) => top.appendChild(el("th", t)));
    }
    head.appendChild(top);
    table.appendChild(head);
    const body = el("tbody");
    const scale = map.vmax > 0 ? map.vmax : 1;
    map.w.forEach((row, i) => {
      const tr = el("tr", undefined, i === current ? "current" : "");
      tr.dataset.row = i;
      tr.appendChild(el("th", a.rows[i], "tgt"));
      row.forEach((v, j) => {
        const masked = causal && j > i;
        const td = el("td", undefined, masked ? "w masked" : "w");
        if (!masked) td.style.background = colour(v / scale);
        Object.assign(td.dataset, { i: i, j: j, w: v });
        tr.appendChild(td);
      });
      if (numbers) {
        tr.appendChild(el("td", "", "sep"));
        numbers.row(i).forEach((x) => tr.appendChild(el("td", x, "num")));
      }
      body.appendChild(tr);
    });
    table.appendChild(body);
    // The estimate above ignores the real label widths: shrink the cells to what fits,
    // never below MIN_CELL (past that the map scrolls).
    const over = table.offsetWidth - table.parentElement.clientWidth;
    if (over > 0 && cell > MIN_CELL) {
      const fit = Math.max(MIN_CELL, cell - Math.ceil(over / a.cols.length));
      table.style.setProperty("--cell", fit + "px");
    }
  }

  const attentionNumbers = (map) => ({
    head: ["entropy (bits)", "EOS mass", "punct mass"],
    row: (i) => [map.entropy[i], map.eos[i], map.punct[i]].map((x) => x.toFixed(2)),
  });
  // Per row: the source position attended most in the cross-attention the Layer and Head
  // selectors choose, the one whose hiding lowers the row's token most (or those tied with
  // it), and whether they are one.
  const crossChoice = (r) => "layer " + crossLayer(r) + ", head " + state.head;
  const tiedTokens = (r, i) => {
    const t = r.influence.tied[i];
    return t.length <= 3 ? t.map((j) => r.src[j]).join("=") : "a " + t.length + "-way tie";
  };
  const sameText = (agree) => agree === null ? "tie" : agree ? "yes" : "no";
  const agreementNumbers = (r) => ({
    head: ["most attended (" + crossChoice(r) + ")", "most influential", "same"],
    row: (i) => [r.src[crossMap(r).attended[i]], tiedTokens(r, i), sameText(crossMap(r).agree[i])],
  });
  function agreementCount(r) {
    const agree = crossMap(r).agree, decisive = agree.filter((a) => a !== null);
    return "the most-attended source position (cross-attention, " + crossChoice(r) + ") is " +
      "the most influential one in " + decisive.filter(Boolean).length + " of " +
      decisive.length + " rows that are not ties";
  }

  // --- step-through -------------------------------------------------------------------
  function stopText(r) {
    if (r.teacher_forced) {
      return "Teacher-forced on the given reference: the steps are its subwords and its EOS; " +
        "the search did not run, so no max_len applied.";
    }
    const ban = r.ban_eos ? " EOS was banned, so only max_len could stop it." : "";
    if (r.stop_reason === "eos") {
      return "The loop stopped at step " + r.stop_step + ": the output chose EOS (stop " +
        "reason eos; max_len " + r.max_len + " would have stopped it at step " + r.max_len +
        ")." + ban;
    }
    return "The loop stopped at step " + r.stop_step + ": it reached max_len = " + r.max_len +
      " (stop reason max_len)." + ban;
  }

  function drawEosTrace(r) {
    const svg = $("eos-trace");
    const n = r.steps.length, w = Math.max(4, Math.min(16, Math.floor(300 / n)));
    svg.textContent = "";
    svg.setAttribute("width", n * w + 2);
    r.steps.forEach((s, k) => {
      const h = Math.max(1, s.p_eos * 56);
      const bar = svgEl("rect", { x: k * w + 1, y: 58 - h, width: w - 1, height: h,
        fill: k + 1 === r.stop_step && r.stop_reason === "eos" ? "#c22" : "#3b528b" });
      if (k + 1 === state.step) { bar.setAttribute("stroke", "#000"); bar.setAttribute("stroke-width", 2); }
      const title = svgEl("title");
      title.textContent = "step " + (k + 1) + ": P(EOS) = " + prob(s.p_eos);
      bar.appendChild(title);
      svg.appendChild(bar);
    });
  }

  // One row over the source as bars (a weight, or a drop: a rise draws as none); i: its map
  // row, for the hover (null: a row of no map).
  function drawBars(box, r, row, i) {
    box.textContent = "";
    const max = Math.max(...row) || 1;
    row.forEach((v, j) => {
      const label = el("span", r.src[j]);
      const bar = el("div", undefined, "bar");
      bar.style.width = (100 * Math.max(v, 0) / max) + "%";
      const value = el("span", v.toFixed(3));
      [label, bar, value].forEach((e) => {
        if (i !== null) Object.assign(e.dataset, { i: i, j: j, w: v });
        box.appendChild(e);
      });
    });
  }

  function drawStepRow(r) {
    $("step-row-title").textContent = "The cross-attention row step " + state.step +
      " used (" + crossChoice(r) + "):";
    drawBars($("step-row"), r, stepWeights(r), currentRow(r));
  }

  function drawHypotheses(r) {
    const table = $("hypotheses");
    $("hypotheses-box").hidden = !(r.beam > 1) || r.teacher_forced;
    table.textContent = "";
    const head = el("tr");
    ["", "translation", "subwords", "log-prob", "normalized score (ranked by)", "stop"].forEach(
      (t) => head.appendChild(el("th", t)));
    table.appendChild(head);
    r.hypotheses.forEach((h) => {
      const tr = el("tr", undefined, h.chosen ? "chosen" : "");
      [h.chosen ? "chosen" : "", h.translation, h.length, h.score.toFixed(4),
        h.normalized_score.toFixed(4), h.stop_reason].forEach((t) => tr.appendChild(el("td", t)));
      table.appendChild(tr);
    });
  }

  // Row i's most attended and most influential source position, and whether they are one.
  function drawAgreement(r, box = $("step-agreement"), i = currentRow(r)) {
    box.textContent = "";
    if (!r.influence) return;
    const f = r.influence, m = crossMap(r);
    box.dataset.agree = sameText(m.agree[i]);
    const verdict = m.agree[i] === null
      ? el("span", "a tie: drops within " + f.tie_nats + " nats of each other, which the " +
        "map's precision can order either way", "tie")
      : el("span", m.agree[i] ? "the same position" : "not the same",
        m.agree[i] ? "agree" : "disagree");
    box.append("most attended (" + crossChoice(r) + "): ", el("b", r.src[m.attended[i]]),
      "; most influential (occlusion): ", el("b", tiedTokens(r, i)), " \u2014 ", verdict);
  }

  function drawStep(r) {
    const s = r.steps[state.step - 1];
    const slider = $("step-slider");
    slider.max = r.steps.length;
    slider.value = state.step;
    const last = state.step === r.stop_step ? " \u2014 the last step (" + r.stop_reason + ")" : "";
    $("step-label").textContent = "step " + state.step + " of " + r.steps.length + last;
    $("step-token").textContent = s.token;
    $("step-prob").textContent = prob(s.prob);
    $("step-prob").dataset.value = s.prob;
    $("p-eos").textContent = prob(s.p_eos);
    $("p-eos").dataset.value = s.p_eos;
    const list = $("top5");
    list.textContent = "";
    s.top.forEach((t) => {
      const li = el("li", t.token, t.token === s.token ? "chosen" : "");
      li.appendChild(el("span", prob(t.prob), "p"));
      li.dataset.token = t.token;
      li.dataset.prob = t.prob;
      list.appendChild(li);
    });
    drawEosTrace(r);
    drawStepRow(r);
    drawAgreement(r);
    $("step-kind-note").textContent = state.kind === "cross" ? "" : "The step-through shows " +
      "cross-attention, whose rows are the decoding steps; the " + shownKind(r).name +
      " chosen above is drawn in the Heatmap, Lines and Model views.";
    drawHeatmap($("step-map"), r, "cross", crossMap(r),
      r.influence ? agreementNumbers(r) : null, currentRow(r));
    drawHypotheses(r);
  }

  // --- heatmap view: attention or influence, each with its own legend -------------------
  function drawMapView(r) {
    const influence = state.map === "influence";
    const map = influence ? r.influence : currentMap(r);
    document.querySelectorAll(".toggle button").forEach((b) => {
      b.setAttribute("aria-pressed", String(b.dataset.map === state.map));
      b.disabled = b.dataset.map === "influence" && !r.influence;
      b.title = b.disabled ? "not computed for this sentence" +
        (DATA.form ? ": tick influence and translate again" : "") : "";
    });
    $("map-title").textContent = map.title;
    $("map-summary").textContent = map.summary +
      (influence ? " \u00b7 " + agreementCount(r) : "");
    $("masked-legend").hidden = influence || !shownKind(r).causal;
    $("legend-max").textContent = map.vmax.toFixed(3);
    $("legend-text").textContent = influence
      ? "(colour relative to this map's largest drop in log-probability, in nats; a rise, " +
        "where hiding a position made the token more likely, is drawn as 0)"
      : "(colour relative to this map's largest weight)";
    $("map-measures").textContent = influence
      ? map.note + " Not a property of the layer and head chosen above: a position is " +
        "hidden from every layer at once. Rows and columns as in the attention map."
      : state.kind === "cross"
        ? "Attention: how much each output position (row) read from each source position, " +
          "in layer " + state.layer + ", head " + state.head + "; each row sums to 1. It " +
          "shows where a query read, not what the source did to the output: the influence " +
          "map measures that one way."
        : "The " + shownKind(r).name + ": how much each " + shownKind(r).axes[0] +
          " read from each " + shownKind(r).axes[1] + ", in layer " + state.layer +
          ", head " + state.head + "; each row sums to 1." + (shownKind(r).causal
          ? " Row n is the decoder's input at step n (BOS, then the output so far): it " +
            "may read itself and the positions before it, never a later one." : "");
    const kind = influence ? "cross" : state.kind;
    const current = kindRow(r, kind);
    drawHeatmap($("heatmap"), r, kind, map,
      influence ? agreementNumbers(r) : attentionNumbers(map), current,
      influence ? "drop (nats)" : "weight");
  }

  // --- line view ----------------------------------------------------------------------
  function drawLines(r) {
    const svg = $("lines"), a = shownKind(r);
    const map = currentMap(r), pitch = 22, top = 40;
    svg.dataset.kind = state.kind;
    const width = Math.min(Math.max(document.documentElement.clientWidth - 100, 480), 900);
    const xt = 170, xs = width - 170;
    svg.textContent = "";
    svg.classList.remove("focus");
    svg.setAttribute("width", width);
    svg.setAttribute("height", top + pitch * Math.max(a.rows.length, a.cols.length) + 10);
    const y = (k) => top + pitch * k;
    const current = kindRow(r, state.kind);
    map.w.forEach((row, i) => row.forEach((v, j) => {
      if (v < 0.005) return;
      const line = svgEl("line", { x1: xt, y1: y(i), x2: xs, y2: y(j), "stroke-opacity": v });
      line.setAttribute("class", "i" + i + " j" + j + (i === current ? " current" : ""));
      Object.assign(line.dataset, { i: i, j: j, w: v });
      svg.appendChild(line);
    }));
    function focus(cls) {
      svg.classList.add("focus");
      svg.querySelectorAll("line." + cls).forEach((l) => l.classList.add("on"));
    }
    function unfocus() {
      svg.classList.remove("focus");
      svg.querySelectorAll("line.on").forEach((l) => l.classList.remove("on"));
    }
    const label = (text, x, k, anchor, cls) => {
      const t = svgEl("text", { x: x, y: y(k) + 4, "text-anchor": anchor });
      t.textContent = text;
      t.addEventListener("mouseenter", () => focus(cls));
      t.addEventListener("mouseleave", unfocus);
      svg.appendChild(t);
      return t;
    };
    a.rows.forEach((t, i) => {
      const text = label(t, xt - 8, i, "end", "i" + i);
      if (i === current) text.classList.add("current");
    });
    a.cols.forEach((t, j) => label(t, xs + 8, j, "start", "j" + j));
    const heading = (text, x, anchor) => {
      const t = svgEl("text", { x: x, y: 16, "text-anchor": anchor, "font-weight": "bold" });
      t.textContent = text;
      svg.appendChild(t);
    };
    heading(a.axes[0], xt - 8, "end");
    heading(a.axes[1], xs + 8, "start");
  }

  // --- model view ---------------------------------------------------------------------
  function drawModel(r) {
    const grid = $("model-grid"), a = shownKind(r);
    grid.textContent = "";
    grid.dataset.kind = state.kind;
    $("model-kind").textContent = a.name + (a.causal ? "; grey: masked, never read" : "");
    grid.style.gridTemplateColumns = "repeat(" + (r.n_heads + 2) + ", max-content)";
    const px = Math.max(2, Math.min(8, Math.floor(110 / Math.max(a.cols.length, a.rows.length))));
    a.maps.forEach((heads, l) => {
      grid.appendChild(el("div", "layer " + (l + 1), "small"));
      heads.forEach((map, h) => {
        const head = h === r.n_heads ? "mean" : h + 1;
        const fig = el("figure", undefined, l + 1 === state.layer && head === state.head ? "selected" : "");
        Object.assign(fig.dataset, { layer: l + 1, head: head });
        const canvas = el("canvas");
        canvas.width = a.cols.length * px;
        canvas.height = a.rows.length * px;
        const ctx = canvas.getContext("2d");
        const scale = map.vmax > 0 ? map.vmax : 1;
        map.w.forEach((row, i) => row.forEach((v, j) => {
          ctx.fillStyle = a.causal && j > i ? MASKED_GREY : colour(v / scale);
          ctx.fillRect(j * px, i * px, px, px);
        }));
        canvas.addEventListener("mousemove", (event) => {
          const box = canvas.getBoundingClientRect();
          const i = Math.floor((event.clientY - box.top) / px), j = Math.floor((event.clientX - box.left) / px);
          if (i >= 0 && i < a.rows.length && j >= 0 && j < a.cols.length) {
            showTip(event, r, i, j, map.w[i][j], "weight", state.kind);
          }
        });
        canvas.addEventListener("mouseleave", hideTip);
        fig.appendChild(canvas);
        fig.appendChild(el("figcaption", "L" + (l + 1) + (head === "mean" ? " mean" : " H" + head)));
        fig.addEventListener("click", () => setState({ layer: l + 1, head: head, view: "heatmap" }));
        grid.appendChild(fig);
      });
    });
  }

  // --- interventions: held ones (a written page), or asked of the server (serve) ----------
  const specOf = (c) => c.kind === "mask" ? "mask:" + c.masked
    : c.kind + ":" + (c.layer === null ? "all" : c.layer);
  const held = (r, spec) => r.interventions.find((c) => specOf(c) === spec);
  const info = (length, stop) => "(" + length + " subwords, stop reason " + stop + ")";

  // Words changed or added in the new output, and changed or removed of the original: a
  // truncated output changes none of its words but removes the rest.
  const count = (flags) => flags.filter(Boolean).length;
  const changes = (c) => count(c.changed) + " of " + c.words.length + " words changed, " +
    count(c.removed) + " of " + c.original_words.length + " of the original's changed or removed";

  function drawWords(box, words, changed) {
    box.textContent = "";
    words.forEach((w, k) => {
      if (k) box.append(" ");
      box.appendChild(el(changed[k] ? "mark" : "span", w));
    });
  }

  function interventionsNote(r) {
    const greedy = r.decoding === "greedy search" ? "" : " They decode greedily, so " +
      "\u201cwithout\u201d is greedy search's output, which can differ from the translation " +
      "above (" + r.decoding + ").";
    if (DATA.form) {
      return "Decode this sentence again with one layer's (or every layer's) cross-attention " +
        "weights replaced, or a source word hidden from every layer: the server computes it. " +
        "Changed words are marked." + greedy;
    }
    const specs = r.interventions.map((c) => c.spec).join(", ") || "none";
    return "This page holds the interventions it was written with: " + specs + " (every " +
      "page has uniform and permuted weights in each layer and in all at once; " +
      "--intervene adds more). Others: seq2seq attention RUN SENTENCE --intervene KIND:N, " +
      "or seq2seq serve. Changed words are marked." + greedy;
  }

  // What a written page answers for an intervention it does not hold: how to get it.
  function notHeld(r, spec) {
    const words = r.word_level ? " --words" : "";
    const source = '"' + r.source.replace(/["\\$`]/g, "\\$&") + '"'; // for a shell
    return "Not on this page: " + spec + ". To decode it: seq2seq attention RUN " + source +
      words + " --intervene " + spec + " -o page.html (RUN: the run this page came from), " +
      "or seq2seq serve RUN, where a click decodes it.";
  }

  function drawInterventions(r) {
    const spec = state.spec || (r.interventions.length ? specOf(r.interventions[0]) : null);
    const shown = spec && held(r, spec);
    $("interventions-note").textContent = interventionsNote(r);
    $("intervene").hidden = !DATA.form;
    if (spec && !spec.startsWith("mask:")) {
      const [kind, where] = spec.split(":");
      $("kind-select").value = kind;
      $("where-select").value = where;
    }
    const words = $("mask-words");
    words.textContent = "";
    r.src.forEach((t, j) => {
      const b = el("button", t, spec === "mask:" + (j + 1) ? "masked" : "");
      b.type = "button";
      b.dataset.position = j + 1;
      b.title = "hide \u201c" + t + "\u201d from every layer's cross-attention";
      b.addEventListener("click", () => choose("mask:" + (j + 1)));
      words.appendChild(b);
    });
    $("intervention-result").hidden = !shown;
    if (!$("intervention-status").dataset.kind) { // a request's message stays until the next
      setStatus(spec && !shown && !DATA.form ? notHeld(r, spec) : "");
    }
    if (shown) {
      drawWords($("original-words"), shown.original_words, shown.removed);
      $("original-info").textContent = info(shown.original_length, shown.original_stop_reason);
      $("result-spec").textContent = shown.spec +
        (shown.masked_token ? " (\u201c" + shown.masked_token + "\u201d hidden)" : "");
      drawWords($("result-words"), shown.words, shown.changed);
      $("result-info").textContent = info(shown.length, shown.stop_reason) + ", " +
        changes(shown);
    }
    const table = $("interventions");
    table.textContent = "";
    if (!r.interventions.length) return;
    const head = el("tr");
    ["intervention", "translation", "words changed / removed", "length", "stop"].forEach(
      (t) => head.appendChild(el("th", t)));
    table.appendChild(head);
    r.interventions.forEach((c) => {
      const tr = el("tr", undefined, specOf(c) === spec ? "chosen" : "");
      tr.dataset.spec = specOf(c);
      [c.spec, c.translation, count(c.changed) + " / " + count(c.removed), c.length,
        c.stop_reason]
        .forEach((t) => tr.appendChild(el("td", t)));
      tr.addEventListener("click", () => choose(specOf(c)));
      table.appendChild(tr);
    });
  }

  // kind: "" (a note), "pending" (a request is out) or "error" (its answer)
  function setStatus(text, kind) {
    const status = $("intervention-status");
    status.textContent = text;
    status.dataset.kind = kind || "";
    if (kind !== undefined) document.body.setAttribute("data-intervention", kind || "ok");
  }

  // Show an intervention: held, or (served) asked of the server, then held.
  function choose(spec) {
    const r = rec(), form = DATA.form;
    if (held(r, spec) || !form) {
      setStatus("");
      setState({ spec: spec });
      return;
    }
    const body = new URLSearchParams({ text: r.source, spec: spec, max_len: form.max_len || "",
      ban_eos: form.ban_eos ? "1" : "", words: form.words ? "1" : "" });
    setStatus("decoding with " + spec + " \u2026", "pending");
    fetch("/intervene", { method: "POST", body: body })
      .then((response) => response.json().then((answer) => [response.status, answer]))
      .then(([code, answer]) => {
        if (!answer.intervention) {
          setStatus(answer.error + " (HTTP " + code + ")", "error");
          return;
        }
        r.interventions.push(answer.intervention);
        setStatus("", "");
        if (rec() === r) setState({ spec: spec }); // unless another sentence is shown now
      })
      .catch((e) => setStatus("no answer from the server: " + e, "error"));
  }

  // --- beam search tree: each step's candidates and their fates; the endings re-ranked ----
  const FATES = {
    kept: "kept: among the K best continuations that did not end, a beam of the next step",
    eos: "finished: EOS among the K best continuations of its step",
    max_len: "finished: kept at the step its sentence reached max_len",
    width: "pruned: outside the K best continuations of its step (the beam width)",
    eos_ban: "EOS, banned (--ban-eos): the search never scored it; the log-probability is " +
      "the model's before the ban",
  };
  const COLUMN = 118, BOX = 104, ROW = 18;
  // The search's length penalty and normalized score (seq2seq.decoding.beam, its constants in
  // the tree): score / ((base + steps) / scale) ** alpha, steps counting the EOS.
  const penalty = (t, steps, alpha) => Math.pow((t.penalty.base + steps) / t.penalty.scale, alpha);
  const normalizedAt = (t, e, alpha) => e.score / penalty(t, e.steps, alpha);
  const alphaOf = (t) => (state.alpha === null ? t.alpha : state.alpha);
  const short = (token) => (token.length > 10 ? token.slice(0, 9) + "\u2026" : token);
  const nodeText = (n) => "step " + n.step + ": " + n.token + " \u00b7 log p " +
    n.logp.toFixed(3) + " \u00b7 score " + n.score.toFixed(3) + " \u00b7 normalized " +
    n.normalized.toFixed(3) + " \u00b7 " + n.fate;
  const ancestry = (t, n) => {
    const tokens = [];
    for (let m = n; m.parent !== null; m = t.nodes[m.parent]) tokens.unshift(m.token);
    return tokens;
  };
  // The chosen hypothesis' last node (the root where it ended past the tree's step cap).
  const chosenNode = (t) => {
    const e = t.endings.find((x) => x.chosen);
    return e && e.node !== null ? e.node : 0;
  };

  function treeNote(t) {
    const f = (x) => x.toFixed(3);
    const end = t.end.reason === "max_len" ? "its open beams reached max_len"
      : "it held K = " + t.beam + " finished hypotheses, and the best open beam's normalized " +
        "score (" + f(t.end.best_open) + ") could not beat the worst of them (" +
        f(t.end.worst_finished) + ")";
    const cap = t.truncated ? " It ran past " + t.max_steps + " steps: the tree draws the " +
      "first " + t.max_steps + " and the table lists everything that ended, later ones too." : "";
    return "Beam search, K = " + t.beam + ", length penalty \u03b1 = " + t.alpha + ". A column " +
      "per step, its candidates best first by score (the sum of log-probabilities): per open " +
      "beam its " + t.width + " best continuations (K + 1, at least 3, hold every one the " +
      "search kept or finished). It stopped at step " + t.end.step + ": " + end + "." + cap +
      " Click a node for its numbers and the cross-attention row that scored it.";
  }

  function drawTreeSvg(t) {
    const svg = $("tree"), columns = [], at = {};
    svg.textContent = "";
    t.nodes.forEach((n) => { (columns[n.step] = columns[n.step] || []).push(n); });
    columns.forEach((column, step) => {
      column.sort((a, b) => b.score - a.score);
      column.forEach((n, k) => { at[n.id] = [6 + step * COLUMN, 12 + k * ROW]; });
    });
    svg.setAttribute("width", columns.length * COLUMN + 10);
    svg.setAttribute("height", Math.max(...columns.map((c) => c.length)) * ROW + 10);
    t.nodes.forEach((n) => {
      if (n.parent === null) return;
      const [x1, y1] = at[n.parent], [x2, y2] = at[n.id];
      svg.appendChild(svgEl("line", { x1: x1 + BOX, y1: y1, x2: x2, y2: y2,
        class: n.fate + (n.chosen ? " chosen" : "") }));
    });
    t.nodes.forEach((n) => {
      const [x, y] = at[n.id];
      const g = svgEl("g", { class: "node " + n.fate + (n.id === state.node ? " selected" : ""),
        "data-node": n.id, "data-fate": n.fate, "data-score": n.score });
      g.appendChild(svgEl("rect", { x: x, y: y - 8, width: BOX, height: 16, rx: 3 }));
      const text = svgEl("text", { x: x + 3, y: y + 4 });
      text.textContent = short(n.token) + "  " + n.score.toFixed(2);
      g.appendChild(text);
      const title = svgEl("title");
      title.textContent = nodeText(n);
      g.appendChild(title);
      g.addEventListener("click", () => setState({ node: n.id }));
      svg.appendChild(g);
    });
  }

  // A node's numbers, the cross-attention row its parent's query read when the search scored
  // it (the step view's bars), and its influence where the page has it.
  function drawNode(r, t) {
    const n = t.nodes[state.node === null ? chosenNode(t) : state.node];
    const info = $("node-info"), tokens = ancestry(t, n);
    info.textContent = "";
    info.append(el("p", n.step ? "step " + n.step + ": " : "the root (BOS): the start of " +
      "every hypothesis"), el("p", tokens.join(" "), "small"));
    if (n.step) {
      [["log p (this token)", n.logp], ["score (sum of log p)", n.score],
        ["normalized (score / penalty at " + n.step + " steps)", n.normalized]]
        .forEach(([name, v]) => info.append(el("p", name + " = " + v.toFixed(4))));
      info.append(el("p", FATES[n.fate], "fate " + n.fate));
    }
    const parent = n.parent === null ? null : t.nodes[n.parent];
    const row = parent && parent.attention ? parent.attention[state.layer - 1] : null;
    $("node-row-title").textContent = row ? "The cross-attention row that scored it (step " +
      n.step + ", layer " + state.layer + ", the mean of its heads: the tree keeps no single " +
      "head):" : "";
    if (row) drawBars($("node-row"), r, row, null); else $("node-row").textContent = "";
    drawNodeInfluence(r, n, tokens);
  }

  function drawNodeInfluence(r, n, tokens) {
    const box = $("node-influence"), title = $("node-influence-title");
    [box, title, $("node-agreement")].forEach((e) => { e.textContent = ""; });
    if (!n.step) return;
    if (n.chosen && r.influence) {
      const i = r.step_rows ? r.step_rows[n.step - 1] : n.step - 1;
      title.textContent = "Its influence by occlusion (the chosen hypothesis: the step view's " +
        "row " + (i + 1) + "), the drop in nats when a source position is hidden from every layer:";
      drawBars(box, r, r.influence.w[i], i);
      drawAgreement(r, $("node-agreement"), i);
      return;
    }
    const text = tokens.join("").replace(/\u2581/g, " ").replace("</s>", "").trim();
    title.textContent = "Influence by occlusion is on this page for the chosen hypothesis' " +
      "nodes (the red line)" + (r.influence ? "" : ", where computed") + ". For this one, " +
      "teacher-force its text: seq2seq attention RUN \u201c" + r.source + "\u201d --reference " +
      "\u201c" + text + "\u201d";
  }

  function drawEndings(t) {
    const alpha = alphaOf(t), slider = $("alpha-slider");
    slider.min = Math.min(-1, t.alpha);
    slider.max = Math.max(3, t.alpha);
    slider.value = alpha;
    $("alpha-value").textContent = alpha.toFixed(2);
    const ranked = t.endings.map((e) => ({ e: e, at: normalizedAt(t, e, alpha) }))
      .sort((a, b) => b.at - a.at);
    const table = $("endings");
    table.textContent = "";
    const head = el("tr");
    ["rank", "hypothesis", "steps (with EOS)", "score (log p)", "penalty at \u03b1",
      "normalized at \u03b1", "at the search's \u03b1", "stop", "the search"]
      .forEach((x) => head.appendChild(el("th", x)));
    table.appendChild(head);
    ranked.forEach(({ e, at }, k) => {
      const tr = el("tr", undefined, k === 0 ? "best" : "");
      if (e.node !== null) tr.dataset.node = e.node;
      const kept = e.chosen ? "chosen" : e.returned ? "returned" : "ended, not among the K kept";
      [k + 1, e.translation, e.steps, e.score.toFixed(4), penalty(t, e.steps, alpha).toFixed(4),
        at.toFixed(4), e.normalized.toFixed(4), e.stop_reason, kept]
        .forEach((x) => tr.appendChild(el("td", x)));
      if (e.node !== null) tr.addEventListener("click", () => setState({ node: e.node }));
      table.appendChild(tr);
    });
    $("ranking-why").textContent = rankingWhy(t, ranked, alpha);
    $("alpha-note").textContent = "The slider ranks what this search ended by score / ((" +
      t.penalty.base + " + steps) / " + t.penalty.scale + ") ** \u03b1, the search's formula. " +
      "A search run with another \u03b1 would also prune and stop differently, and could end " +
      "with other hypotheses: " + (DATA.form ? "set the length penalty in the form above and " +
      "translate again." : "seq2seq attention --length-penalty A, or seq2seq serve, decodes " +
      "again with it.");
  }

  function rankingWhy(t, ranked, alpha) {
    const best = ranked[0], chosen = ranked.find((x) => x.e.chosen);
    const quote = (x) => "\u201c" + x.e.translation + "\u201d (" + x.e.steps + " steps)";
    if (best === chosen) {
      return "At \u03b1 = " + alpha.toFixed(2) + " the search's choice ranks first: " +
        quote(best) + ".";
    }
    const which = best.e.steps < chosen.e.steps ? "A shorter hypothesis wins" :
      best.e.steps > chosen.e.steps ? "A longer hypothesis wins" : "Another hypothesis wins";
    const part = (x) => x.e.score.toFixed(3) + " / " + penalty(t, x.e.steps, alpha).toFixed(3) +
      " = " + x.at.toFixed(3);
    return which + " at \u03b1 = " + alpha.toFixed(2) + ": " + quote(best) + " scores " +
      part(best) + ", the search's choice " + quote(chosen) + " " + part(chosen) + ". Every " +
      "token adds a negative log-probability, so a longer sum is lower; a larger \u03b1 " +
      "divides it by more, a smaller one favours the shorter.";
  }

  function drawTree(r) {
    const t = r.tree;
    $("tree-box").hidden = !t;
    if (!t) {
      $("tree-note").textContent = r.teacher_forced
        ? "Teacher-forced on a given reference: no search ran, so there is no tree."
        : "Greedy search keeps one hypothesis a step: no tree to draw. Decode with a beam of " +
          "2 or more (" + (DATA.form ? "beam in the form above" : "--beam K") + ").";
      return;
    }
    $("tree-note").textContent = treeNote(t);
    // The slider re-ranks the endings alone: the tree and the node stay as drawn.
    const drawn = [state.sentence, state.node, state.layer, innerWidth].join(":");
    if ($("tree").dataset.drawn !== drawn) {
      drawTreeSvg(t);
      drawNode(r, t);
      $("tree").dataset.drawn = drawn;
    }
    drawEndings(t);
  }

  // --- state --------------------------------------------------------------------------
  function render() {
    const r = rec();
    document.querySelectorAll(".view").forEach((v) => { v.hidden = v.id !== "view-" + state.view; });
    document.querySelectorAll(".tabs button").forEach((b) => {
      b.setAttribute("aria-selected", String(b.dataset.view === state.view));
    });
    $("sentence-select").value = String(state.sentence);
    $("attention-select").value = state.kind;
    setLayerOptions(shownKind(r).n_layers);
    $("layer-select").value = String(state.layer);
    $("head-select").value = String(state.head);
    $("source").textContent = r.source;
    $("translation").textContent = r.translation;
    $("decoding").textContent = r.decoding;
    $("stop-info").textContent = stopText(r);
    $("notes").textContent = (r.notes || []).join("; ");
    $("word-note").textContent = r.word_level || "";
    if (state.view === "step") drawStep(r);
    if (state.view === "heatmap") drawMapView(r);
    if (state.view === "lines") drawLines(r);
    if (state.view === "model") drawModel(r);
    if (state.view === "interventions") drawInterventions(r);
    if (state.view === "tree") drawTree(r);
    const attrs = { view: state.view, sentence: state.sentence + 1, step: state.step,
      kind: state.kind, layer: state.layer, head: state.head, map: state.map };
    if (state.spec) attrs.spec = state.spec;
    if (state.node !== null) attrs.node = state.node;
    if (state.alpha !== null) attrs.alpha = state.alpha;
    ["spec", "node", "alpha"].forEach((k) => document.body.removeAttribute("data-" + k));
    Object.entries(attrs).forEach(([k, v]) => document.body.setAttribute("data-" + k, v));
    const hash = Object.entries(attrs).map(([k, v]) => k + "=" + v).join("&");
    // Inside a frame's srcdoc (a notebook's output) the page has no URL of its own to write.
    if (location.href !== "about:srcdoc") history.replaceState(null, "", "#" + hash);
  }

  function setState(changes) {
    Object.assign(state, changes);
    const r = rec();
    state.step = Math.min(Math.max(1, state.step), r.steps.length);
    if (!attentionOf(r, state.kind)) state.kind = "cross"; // a record without self-attention
    state.layer = Math.min(state.layer, shownKind(r).n_layers); // the encoder's may be fewer
    if (!r.influence) state.map = "attention"; // the toggle is off where none was computed
    if (!r.tree || !(state.node >= 0 && state.node < r.tree.nodes.length)) state.node = null;
    render();
  }

  // A request from the URL hash, checked: anything out of range falls back to a default
  // with a note saying so.
  function fromHash() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ""));
    const r0 = DATA.records[0], wrong = [];
    const sentence = parseInt(p.get("sentence") || "1", 10);
    const layer = parseInt(p.get("layer") || "1", 10);
    const headText = p.get("head") || "mean";
    const head = headText === "mean" ? "mean" : parseInt(headText, 10);
    const view = p.get("view") || "step";
    const map = p.get("map") || "attention";
    const kind = p.get("kind") || "cross";
    const out = { sentence: 0, layer: 1, head: "mean", view: "step", map: "attention",
      spec: p.get("spec"), step: parseInt(p.get("step") || "1", 10) || 1, kind: "cross",
      node: p.has("node") ? parseInt(p.get("node"), 10) : null,
      alpha: p.has("alpha") && isFinite(parseFloat(p.get("alpha"))) ? parseFloat(p.get("alpha")) : null };
    if (sentence >= 1 && sentence <= DATA.records.length) out.sentence = sentence - 1;
    else wrong.push("sentence " + p.get("sentence"));
    if (KINDS.includes(kind) && attentionOf(r0, kind)) out.kind = kind;
    else wrong.push("kind " + kind);
    const n_layers = attentionOf(r0, out.kind).n_layers;
    if (layer >= 1 && layer <= n_layers && (head === "mean" || (head >= 1 && head <= r0.n_heads))) {
      out.layer = layer;
      out.head = head;
    } else wrong.push("layer " + p.get("layer") + ", head " + headText);
    if (VIEWS.includes(view)) out.view = view; else wrong.push("view " + view);
    if (MAPS.includes(map) && (map === "attention" || DATA.records[out.sentence].influence)) {
      out.map = map;
    } else wrong.push("map " + map);
    $("note").textContent = wrong.length ? "No map for " + wrong.join("; ") +
      "; showing the first sentence, cross-attention, layer 1, head mean, attention where " +
      "that was asked." : "";
    setState(out);
  }

  // The Layer selector's options: the layers of the attention shown (encoder or decoder).
  function setLayerOptions(n_layers) {
    const select = $("layer-select");
    if (select.options.length === n_layers) return;
    select.textContent = "";
    for (let l = 1; l <= n_layers; l++) option(select, String(l), String(l));
  }

  function setUpForm() {
    const form = DATA.form;
    if (!form) return;
    $("explore-form").hidden = false;
    $("text").value = form.text || "";
    $("beam").value = form.beam || "";
    $("length-penalty").value = form.length_penalty || "";
    $("max-len").value = form.max_len || "";
    $("ban-eos").checked = !!form.ban_eos;
    $("words").checked = !!form.words;
    $("influence").checked = !!form.influence;
  }

  function setUp() {
    setUpForm();
    if (!DATA.records.length) return;
    $("explorer").hidden = false;
    const r0 = DATA.records[0];
    DATA.records.forEach((r, k) => option($("sentence-select"), String(k), (k + 1) + ": " + r.source));
    $("sentence-picker").hidden = DATA.records.length < 2;
    option($("attention-select"), "cross", "cross-attention (target reads source)");
    Object.entries(r0.self_attention || {}).forEach(([kind, a]) => option($("attention-select"), kind, a.name));
    for (let h = 1; h <= r0.n_heads; h++) option($("head-select"), String(h), String(h));
    option($("head-select"), "mean", "mean");
    option($("where-select"), "all", "all");
    for (let l = 1; l <= r0.n_layers; l++) option($("where-select"), String(l), String(l));
    $("masked-text").textContent = DATA.masked_legend;
    $("legend-bar").style.background =
      "linear-gradient(to right," + STOPS.map((c) => "rgb(" + c.join(",") + ")").join(",") + ")";

    $("sentence-select").addEventListener("change", (e) => {
      setStatus("");
      setState({ sentence: +e.target.value, step: 1, spec: null, node: null, alpha: null });
    });
    $("layer-select").addEventListener("change", (e) => setState({ layer: +e.target.value }));
    $("attention-select").addEventListener("change", (e) => setState({ kind: e.target.value }));
    $("head-select").addEventListener("change", (e) => {
      setState({ head: e.target.value === "mean" ? "mean" : +e.target.value });
    });
    document.querySelectorAll(".tabs button").forEach((b) => {
      b.addEventListener("click", () => setState({ view: b.dataset.view }));
    });
    document.querySelectorAll(".toggle button").forEach((b) => {
      b.addEventListener("click", () => setState({ map: b.dataset.map }));
    });
    const replacement = () => $("kind-select").value + ":" + $("where-select").value;
    ["kind-select", "where-select"].forEach((id) => $(id).addEventListener("change", () => {
      if (!DATA.form) choose(replacement()); // a written page: show what it holds
    }));
    $("intervene").addEventListener("click", () => choose(replacement()));
    $("step-slider").addEventListener("input", (e) => setState({ step: +e.target.value }));
    $("alpha-slider").addEventListener("input", (e) => setState({ alpha: +e.target.value }));
    $("alpha-reset").addEventListener("click", () => setState({ alpha: null }));
    $("prev").addEventListener("click", () => setState({ step: state.step - 1 }));
    $("next").addEventListener("click", () => setState({ step: state.step + 1 }));
    document.addEventListener("keydown", (event) => {
      if (event.target.closest("input, select, textarea")) return; // they have their own keys
      const moves = { ArrowRight: state.step + 1, ArrowLeft: state.step - 1, Home: 1,
        End: rec().steps.length };
      if (!(event.key in moves)) return;
      event.preventDefault();
      setState({ step: moves[event.key] });
    });
    window.addEventListener("hashchange", fromHash);
    window.addEventListener("resize", render); // cell sizes follow the page width
    fromHash();
  }

  setUp();
  document.body.setAttribute("data-status", "ok");
})();
