"""The viewer page in real headless Chromium (system package) driven by Playwright.

Loads a synthetic traced run through `TraceServer`, navigates the graph, reads a node's statistics,
moves the step slider, and checks canvases by the pixel variance of real screenshots (decoded by
the browser itself on a blank page, so no image library is needed).
"""

from __future__ import annotations

import base64
import re

import pytest
import torch
from playwright.sync_api import expect

from minfer.kernels.cpu import vnni as cpu_vnni
from minfer.trace import TraceRecorder
from minfer.trace.server import TraceServer

CANVASES = ["heatmap-canvas", "topk-canvas", "entropy-canvas", "op-time-canvas", "node-history-canvas"]

_VARIANCE_JS = """async (b64) => {
  const img = new Image();
  img.src = "data:image/png;base64," + b64;
  await img.decode();
  const c = document.createElement("canvas");
  c.width = img.width; c.height = img.height;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  let n = 0, s = 0, s2 = 0;
  for (let i = 0; i < d.length; i += 4) {
    const l = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
    s += l; s2 += l * l; n++;
  }
  return s2 / n - (s / n) ** 2;
}"""


def _pixel_variance(browser, png: bytes) -> float:
    page = browser.new_page()  # about:blank: no CSP, the browser decodes the PNG
    try:
        return page.evaluate(_VARIANCE_JS, base64.b64encode(png).decode())
    finally:
        page.close()


@pytest.fixture
def served(demo_trace):
    with TraceServer(demo_trace[0]) as srv:
        yield srv


@pytest.fixture
def page(chromium, served):
    page = chromium.new_page(viewport={"width": 1500, "height": 950})
    problems, requests = [], []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("request", lambda r: requests.append(r.url))
    yield page
    page.close()
    assert not problems, problems
    origin = f"http://127.0.0.1:{served.port}/"
    assert all(u.startswith((origin, "data:")) for u in requests), requests  # no network beyond our server


def _open(page, url):
    page.goto(url)
    page.wait_for_selector("body[data-loaded='1']", timeout=15_000)


def _set_step(page, i):
    page.eval_on_selector("#step-slider", "(e, v) => { e.value = v; e.dispatchEvent(new Event('input')); }", i)


def _stat(page, name) -> str:
    return page.text_content(f"[data-testid=stat-{name}] td")


def test_inspect_node_move_slider_and_canvases(page, served, demo_trace, chromium, tmp_path):
    _, doc, shape = demo_trace
    _open(page, served.url)
    assert page.locator("[data-testid=node-item]").count() == len(doc["graph"])
    assert page.locator("[data-testid=layer-group]").count() == shape.layers + 2  # + input, output

    node = next(n for n in doc["graph"] if n["name"] == "blk.1.ffn_gate+up")  # the fused projection the engine ran
    page.click("[data-testid=layer-group][data-layer='1'] > summary")
    page.click(f"[data-testid=node-item][data-node-id='{node['id']}']")
    assert page.text_content("#node-title") == "blk.1.ffn_gate+up"

    def kernel_at(step):  # what the backend recorded for the step, else the node's decode kernel
        return doc["steps"][step]["kernels"].get(str(node["id"])) or node["kernel"]

    # the VNNI kernel's one int8 pass on the prompt, two on the decode rows; or torch's int4 kernel for both
    if cpu_vnni.available():
        assert (kernel_at(0), kernel_at(5)) == ("cpu_q4_vnni", "cpu_q4_vnni2")
    else:
        assert kernel_at(0) == kernel_at(5) == "cpu_int4pack_mm"
    assert page.text_content("[data-testid=meta-kernel] td") == kernel_at(0)  # the prefill step's kernel
    assert "blk.1.ffn_up.weight" in page.text_content("[data-testid=meta-weights] td")

    def expect_stats(step):
        cols = doc["steps"][step]["nodes"]
        c = cols["id"].index(node["id"])
        for name in ("min", "max", "mean", "std"):
            assert float(_stat(page, name)) == pytest.approx(cols[name][c], rel=1e-5), (step, name)
        assert _stat(page, "shape") == f"[{', '.join(map(str, cols['shape'][c]))}]"
        assert _stat(page, "nan") == "0"

    expect_stats(0)
    topk_before = page.locator("#topk-canvas").screenshot()
    hist_before = page.locator("#node-history-canvas").screenshot()

    _set_step(page, 5)
    assert page.get_attribute("#step-label", "data-step") == "5"
    assert "decode" in page.text_content("#step-label")
    expect_stats(5)
    assert page.text_content("[data-testid=meta-kernel] td") == kernel_at(5)
    tok = doc["steps"][5]["token"]
    assert str(tok["id"]) in page.text_content("#topk-caption")
    topk_changed = page.locator("#topk-canvas").screenshot() != topk_before
    assert topk_changed, "the top-k chart did not change with the step"
    hist_changed = page.locator("#node-history-canvas").screenshot() != hist_before
    assert hist_changed, "the node history's step marker did not move"

    page.hover("#heatmap-canvas", position={"x": 3, "y": 3})
    hover = page.text_content("#heatmap-hover")
    assert re.fullmatch(r"cell \(0, [01]\) = rows 0–0, cols \d+–\d+: mean ≈ -?[\d.e+-]+", hover), hover

    page.screenshot(path=str(tmp_path / "viewer.png"))
    for cid in CANVASES:
        var = _pixel_variance(chromium, page.locator(f"#{cid}").screenshot())
        assert var > 100, f"{cid} looks blank (luminance variance {var:.1f})"


def test_filter_keyboard_and_op_table(page, served, demo_trace):
    _, doc, shape = demo_trace
    _open(page, served.url)
    page.fill("#node-filter", "ffn_down")
    visible = page.locator("[data-testid=node-item]:visible")
    assert visible.count() == shape.layers
    assert page.text_content("#filter-count") == f"{shape.layers} of {len(doc['graph'])}"
    page.fill("#node-filter", "")
    page.click("#collapse-all")
    assert page.locator("[data-testid=node-item]:visible").count() == 0

    page.click("#node-title")  # focus leaves the inputs: arrow keys move the step
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#step-label", "data-step") == "2"

    ops = {n["op"] for n in doc["graph"]}
    rows = page.locator("[data-testid=op-time-row]")
    assert {rows.nth(i).get_attribute("data-op") for i in range(rows.count())} == ops
    page.select_option("#op-time-scope", "all")
    page.click("[data-testid=op-time-row][data-op='SwiGLU']")
    assert page.input_value("#node-filter") == "SwiGLU"
    assert page.locator("[data-testid=node-item]:visible").count() == shape.layers


def test_file_picker_hostile_text_and_bad_file(page, served, tmp_path):
    path = tmp_path / "hostile.json"
    evil = "<img src=x onerror=alert(1)>"
    with TraceRecorder(path, detokenize=lambda i: evil) as rec:
        rec.set_graph([{"id": 0, "name": "<b>bold</b>", "op": "MatMul", "inputs": [], "shape": [2],
                        "dtype": "f32", "layer": None, "kernel": None}])
        rec.begin_step(0, "prefill", 1)
        rec.node(0, torch.tensor([1.0, 2.0]), 1e-6)
        rec.end_step(1, torch.tensor([0.0, 1.0]), evil)

    page.goto(f"http://127.0.0.1:{served.port}/")
    page.set_input_files("#file-input", str(path))
    page.wait_for_selector("body[data-loaded='1']", timeout=15_000)
    assert page.text_content("#token-strip") == evil.replace(" ", "␣")
    assert page.text_content("#node-title") == "<b>bold</b>"
    assert page.locator("#token-strip img, #layout b").count() == 0

    empty = tmp_path / "empty.json"  # a graph but no steps (a run that failed at once) still loads
    with TraceRecorder(empty) as rec:
        rec.set_graph([{"id": 3, "name": "only", "op": "Add", "inputs": [], "shape": [1], "dtype": "f32",
                        "layer": 0, "kernel": None}])
    page.set_input_files("#file-input", str(empty))
    # expect() polls from the driver: the page's CSP (script-src 'self') forbids the string eval
    # that wait_for_function needs when the condition is not already true
    expect(page.locator("#node-title")).to_have_text("only", timeout=5_000)

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "minfer-trace", "version": 7, "graph": [], "steps": []}')
    page.set_input_files("#file-input", str(bad))
    page.wait_for_selector("#status.error", timeout=5_000)
    assert "version 7" in page.text_content("#status")
