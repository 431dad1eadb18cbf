// The chat page: streams /v1/chat/completions, renders Markdown + TeX safely, and shows
// prompt / generated token counts, elapsed time and tokens per second under each reply.
// Images pasted into the prompt or dropped on the composer go with the next message as
// `image_url` parts (data: URLs); a model without a vision tower answers with a 400.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const messagesEl = $("messages"), promptEl = $("prompt"), keyEl = $("api-key");
  let history = [];
  let controller = null;
  let images = [];  // data: URLs pasted or dropped, sent with the next message

  function showImages(container, urls) {
    container.textContent = "";
    for (const url of urls) {
      const img = document.createElement("img");
      img.src = url; img.className = "thumb"; img.alt = "image";
      container.appendChild(img);
    }
  }

  function addImages(files) {
    for (const file of files) {
      if (!file.type.startsWith("image/")) continue;
      const reader = new FileReader();
      reader.onload = () => { images.push(reader.result); showImages($("attachments"), images); };
      reader.readAsDataURL(file);
    }
  }

  keyEl.value = localStorage.getItem("resin-api-key") || "";
  for (const id of ["temperature", "max-tokens"]) {
    $(id).addEventListener("input", () => { $(id).dataset.touched = "1"; });
  }
  keyEl.addEventListener("change", () => { localStorage.setItem("resin-api-key", keyEl.value); loadModel(); });

  function headers() {
    const h = { "Content-Type": "application/json" };
    if (keyEl.value) h["Authorization"] = `Bearer ${keyEl.value}`;
    return h;
  }

  async function loadModel() {
    try {
      const r = await fetch("/v1/models", { headers: headers() });
      const body = await r.json();
      $("model").textContent = r.ok ? body.data[0].id : `(${body.error ? body.error.message : r.status})`;
      // The fields start at the model's own defaults (its generation config), as a request
      // that leaves them out would sample; a value the user already typed is kept.
      const defaults = (r.ok && body.data[0].generation_defaults) || {};
      for (const [id, key] of [["temperature", "temperature"], ["max-tokens", "max_tokens"]]) {
        const input = $(id);
        if (defaults[key] !== undefined && !input.dataset.touched) input.value = String(defaults[key]);
      }
    } catch (e) { $("model").textContent = "(offline)"; }
  }

  function addMessage(role) {
    const div = document.createElement("div");
    div.className = `msg ${role}`;
    const label = document.createElement("div");
    label.className = "role";
    label.textContent = role;
    div.appendChild(label);
    const body = document.createElement("div");
    body.className = role === "user" ? "text" : "content";
    div.appendChild(body);
    messagesEl.appendChild(div);
    messagesEl.scrollTop = messagesEl.scrollHeight;
    return div;
  }

  function renderReply(div, state) {
    let thought = div.querySelector("details");
    if (state.reasoning && !thought) {
      thought = document.createElement("details");
      thought.innerHTML = "<summary>reasoning</summary><div class='reasoning'></div>";
      div.insertBefore(thought, div.querySelector(".content"));
    }
    if (thought) thought.querySelector(".reasoning").textContent = state.reasoning;
    div.querySelector(".content").innerHTML = window.renderMarkdown(state.text);
  }

  function showStats(div, state) {
    let stats = div.querySelector(".stats");
    if (!stats) { stats = document.createElement("div"); stats.className = "stats"; div.appendChild(stats); }
    const now = performance.now();
    const elapsed = (now - state.start) / 1000;
    const decode = state.first ? (now - state.first) / 1000 : 0;
    const rate = decode > 0 && state.generated > 1 ? (state.generated - 1) / decode : 0;
    // The prompt's size is known from the usage chunk at the end; until then it is not shown.
    const prompt = state.prompt === null ? "" : `${state.prompt} prompt tokens · `;
    stats.textContent = `${prompt}${state.generated} generated · ` +
      `${elapsed.toFixed(2)} s · ${rate.toFixed(1)} tok/s`;
    stats.dataset.tokensPerSecond = rate.toFixed(3);
  }

  async function send(text) {
    const sent = images; images = []; showImages($("attachments"), images);
    const content = sent.length
      ? [...sent.map((url) => ({ type: "image_url", image_url: { url } })), { type: "text", text }]
      : text;
    history.push({ role: "user", content });
    const userDiv = addMessage("user");
    userDiv.querySelector(".text").textContent = text;
    if (sent.length) {
      const shown = document.createElement("div"); shown.className = "attachments";
      showImages(shown, sent); userDiv.insertBefore(shown, userDiv.querySelector(".text"));
    }
    const div = addMessage("assistant");
    const state = { text: "", reasoning: "", prompt: null, generated: 0, start: performance.now(), first: null };
    controller = new AbortController();
    $("send").hidden = true; $("stop").hidden = false;
    let pending = false;
    const redraw = () => { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; renderReply(div, state); }); } };
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), signal: controller.signal,
        body: JSON.stringify({
          messages: history, stream: true, stream_options: { include_usage: true },
          max_tokens: Number($("max-tokens").value) || 512,
          temperature: Number($("temperature").value),
        }),
      });
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        throw new Error(body.error ? body.error.message : `HTTP ${r.status}`);
      }
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
          for (const line of frame.split("\n")) {
            if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
            const chunk = JSON.parse(line.slice(6));
            if (chunk.error) throw new Error(chunk.error.message);
            if (chunk.usage) { state.prompt = chunk.usage.prompt_tokens; state.generated = chunk.usage.completion_tokens; }
            for (const choice of chunk.choices || []) {
              const d = choice.delta || {};
              if (d.content || d.reasoning_content) {
                if (state.first === null) state.first = performance.now();
                state.text += d.content || "";
                state.reasoning += d.reasoning_content || "";
                if (!chunk.usage) state.generated += 1;
              }
            }
            redraw();
            showStats(div, state);
          }
        }
      }
      renderReply(div, state);
      showStats(div, state);
      history.push({ role: "assistant", content: state.text });
    } catch (e) {
      const err = document.createElement("div");
      err.className = "error";
      err.textContent = e.name === "AbortError" ? "(stopped)" : `Error: ${e.message}`;
      div.appendChild(err);
      if (state.text) history.push({ role: "assistant", content: state.text });
    } finally {
      controller = null;
      $("send").hidden = false; $("stop").hidden = true;
      messagesEl.scrollTop = messagesEl.scrollHeight;
    }
  }

  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = promptEl.value.trim();
    if ((!text && !images.length) || controller) return;
    promptEl.value = "";
    send(text);
  });
  promptEl.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
  });
  promptEl.addEventListener("paste", (ev) => {
    const files = [...(ev.clipboardData ? ev.clipboardData.files : [])];
    if (files.some((f) => f.type.startsWith("image/"))) { ev.preventDefault(); addImages(files); }
  });
  $("composer").addEventListener("dragover", (ev) => ev.preventDefault());
  $("composer").addEventListener("drop", (ev) => {
    ev.preventDefault();
    addImages([...(ev.dataTransfer ? ev.dataTransfer.files : [])]);
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("new-chat").addEventListener("click", () => {
    history = []; images = []; messagesEl.textContent = ""; showImages($("attachments"), images);
  });
  loadModel();
})();
