"""The web viewer in a real browser: Debian's chromium (headless) driven by
python3-selenium through chromium-driver, against a real opguardd that holds
real PyTorch training runs (tests/e2e/train_gpt.py with faults planted by the
training code) and a synthetic run of a million ops on one rank.

What the page shows is checked against the CLI's report of the same runs.
Screenshots are kept in $OPGUARD_BROWSER_ARTIFACTS (docs/viewer.md)."""
import http.server
import json
import os
import subprocess
import threading
import time
import unittest
import urllib.parse

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import harness

RANKS = 2
STEPS = 2
ARTIFACTS = os.environ.get("OPGUARD_BROWSER_ARTIFACTS") or os.path.join(harness.HERE, "browser-artifacts")
BIG_OPS = 1_000_000


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1100"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


class ViewerTestCase(harness.DaemonTestCase):
    """A daemon and a headless browser per class; `record()` fills the daemon.
    unittest skips tearDownClass when setUpClass fails, so a failed setup
    stops the daemon and the browser itself."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.driver = None
        try:
            os.makedirs(ARTIFACTS, exist_ok=True)
            cls.driver = browser()
            cls.base = f"http://{cls.daemon.status['http']}"
            cls.record()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def record(cls):
        pass

    @classmethod
    def tearDownClass(cls):
        if cls.driver:
            cls.driver.quit()
        super().tearDownClass()

    def open(self, path, **params):
        self.driver.get(self.base + path + ("?" + urllib.parse.urlencode(params) if params else ""))

    def wait(self, css, timeout=60):
        """The first element matching `css`, once it exists (else fails with
        the page's error line, if any)."""
        try:
            return WebDriverWait(self.driver, timeout).until(lambda d: d.find_element(By.CSS_SELECTOR, css))
        except Exception:
            errors = [e.text for e in self.driver.find_elements(By.CSS_SELECTOR, ".error")]
            self.fail(f"{css} did not appear at {self.driver.current_url}; errors on the page: {errors}")

    def shot(self, name):
        self.driver.save_screenshot(os.path.join(ARTIFACTS, name))

    def in_viewport(self, element):
        return self.driver.execute_script(
            "const r = arguments[0].getBoundingClientRect(), l = arguments[0].closest('.vlist')"
            ".getBoundingClientRect(); return r.top >= l.top && r.bottom <= l.bottom;", element)


class StandInChat(http.server.ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint on loopback that keeps what it is
    sent and answers with a fixed text."""

    ANSWER = "stand-in explanation: the matmul's inputs changed upstream"

    def __init__(self):
        self.requests = []
        chat = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                chat.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant",
                                                                        "content": chat.ANSWER}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1/chat/completions"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class RealTraining(ViewerTestCase):
    """A clean reference, a suspect with a changed computation on one rank,
    and a run whose rank 1 broadcasts from the wrong root (a desync). The
    daemon has a stand-in chat endpoint for explanations in prose."""

    @classmethod
    def daemon_args(cls):
        cls.chat = StandInChat()
        return ("--explain.endpoint", cls.chat.url, "--explain.model", "stand-in")

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.chat.shutdown()

    @classmethod
    def record(cls):
        harness.train(cls.site, cls.daemon, "ref", ranks=RANKS, steps=STEPS)
        harness.train(cls.site, cls.daemon, "reorder", ranks=RANKS, steps=STEPS, fault="reorder:1")

    def test_runs_page_lists_runs_and_opens_a_comparison(self):
        self.open("/")
        self.wait("tr[data-run=reorder]")
        names = [r.get_attribute("data-run") for r in self.driver.find_elements(By.CSS_SELECTOR, "tr[data-run]")]
        self.assertLessEqual({"ref", "reorder"}, set(names))
        row = self.driver.find_element(By.CSS_SELECTOR, "tr[data-run=ref]").text
        self.assertIn("2", row)  # ranks
        self.driver.find_element(By.CSS_SELECTOR, "input[name=reference][value=ref]").click()
        self.driver.find_element(By.CSS_SELECTOR, "input[name=suspect][value=reorder]").click()
        self.driver.find_element(By.ID, "compare").click()
        self.wait("#pivot-summary")
        self.assertTrue(self.driver.current_url.startswith(self.base + "/diff?reference=ref&suspect=reorder"))

    def test_pivot_is_highlighted_named_and_explained(self):
        report = self.daemon.cli_json("diff", "ref", "reorder")
        first = report["first_divergence"]
        site = first["site"]["suspect"]
        self.assertEqual((first["rank"], first["op"]), (1, "aten::matmul"))
        self.assertEqual(site["line"], harness.line_of(harness.TRAIN, "scores = torch.matmul(q, k"))

        self.open("/diff", reference="ref", suspect="reorder")
        summary = self.wait("#pivot-summary").text
        self.assertIn(f"rank {first['rank']} · step {first['step']} · {first['op']}", summary)
        self.assertIn(f"train_gpt.py:{site['line']}", summary)
        # The written diagnosis, as the CLI's report gives it.
        diagnosis = self.driver.find_element(By.ID, "diagnosis").text
        self.assertIn(f"diagnosis ({report['diagnosis']['cause']}): ", diagnosis)
        self.assertIn(report["diagnosis"]["text"], diagnosis)
        # An explanation in prose is asked only when the button says so, then
        # shown labelled as generated; the stand-in got the pivot's evidence.
        asked_before = len(self.chat.requests)
        self.wait("#ask-explanation").click()
        text = self.wait("#explanation pre.explanation").text
        self.assertEqual(text, StandInChat.ANSWER)
        self.assertIn("generated by stand-in", self.driver.find_element(By.ID, "explanation").text)
        self.assertEqual(len(self.chat.requests), asked_before + 1)
        self.assertIn(first["op"], self.chat.requests[-1]["messages"][1]["content"])
        self.shot("diff-explanation.png")
        pivot = self.wait(".arow.pivot")
        self.assertIn(f"#{first['op_index']['suspect']} {first['op']}", pivot.text)
        self.assertIn(f"#{first['op_index']['reference']} {first['op']}", pivot.text)
        self.assertTrue(self.in_viewport(pivot), "the pivot is scrolled into view")
        self.assertIn("rank=1", self.driver.current_url)
        # The overview names rank 1 as the origin and the collective that
        # carried divergence to rank 0, as the CLI's report does.
        origin = self.driver.find_element(By.CSS_SELECTOR, "#overview tr[data-rank='1']")
        self.assertIn("diverged first", origin.text)
        self.assertEqual(len(origin.find_elements(By.CSS_SELECTOR, ".cell.origin")), 1)
        explained = {e["rank"]: e for e in report["explained"]}
        carried = self.driver.find_element(By.CSS_SELECTOR, "#overview tr[data-rank='0']").text
        self.assertIn(f"from rank {explained[0]['from_rank']} via ", carried)
        self.assertIn(f"#{explained[0]['seq']}", carried)
        self.shot("diff-pivot.png")

        pivot.click()
        details = self.wait("#details table.details")
        self.assertIn("aten::matmul", details.text)
        for run in ("reference", "suspect"):
            for out in first[run]["outputs"]:
                self.assertIn(out["fingerprint"], details.text)
        self.assertGreater(len(details.find_elements(By.CSS_SELECTOR, "td.differs")), 0)
        with open(harness.TRAIN) as f:
            line_text = f.read().splitlines()[site["line"] - 1].strip()
        lines = self.driver.find_elements(By.CSS_SELECTOR, "#details .source .line.hl")
        self.assertEqual(len(lines), 2, "each run's source, its line highlighted")
        for line in lines:
            self.assertEqual(line.get_attribute("data-line"), str(site["line"]))
            self.assertIn(line_text, line.text)
        self.assertIn(f"op={first['op_index']['suspect']}", self.driver.current_url)
        self.driver.execute_script("document.getElementById('details').scrollIntoView()")
        self.shot("diff-details.png")
        # The whole page at once (docs/viewer-diff.png is one of these).
        self.driver.set_window_size(1400, 1700)
        self.driver.execute_script("window.scrollTo(0, 0)")
        self.shot("diff-page.png")
        self.driver.set_window_size(1400, 1100)

        # The URL is shareable: opening it again selects the same op.
        self.driver.get(self.driver.current_url)
        self.wait("#details .source .line.hl")
        self.assertIn(f"#{first['op_index']['suspect']}", self.wait(".vrow.selected").text)

    def test_trusted_ops_show_as_not_fingerprinted(self):
        harness.train(self.site, self.daemon, "trusted", ranks=RANKS, steps=STEPS,
                      extra_env={"OPGUARD_TRUSTED": "default"})
        linear = next(op for op in self.daemon.trace("trusted", 0) if op["name"] == "aten::linear")
        self.assertTrue(linear["trusted"])
        # A full-mode reference against a trusted suspect: nothing to compare
        # on the trusted ops, so identical, and the details of one show its
        # shapes but no fingerprint, and nothing marked differing.
        self.assertEqual(self.daemon.cli_json("diff", "ref", "trusted")["status"], "identical")
        self.open("/diff", reference="ref", suspect="trusted", rank=0, op=linear["op_index"])
        details = self.wait("#details table.details")
        self.assertIn("aten::linear", details.text)
        self.assertIn("not fingerprinted (trusted op)", details.text)
        reference = self.daemon.trace("ref", 0)[linear["op_index"]]  # the same op, in full mode
        self.assertEqual((reference["name"], reference["trusted"]), ("aten::linear", False))
        self.assertIn(reference["outputs"][0]["fingerprint"], details.text)
        self.assertEqual(details.find_elements(By.CSS_SELECTOR, "td.differs"), [])
        # In the aligned lanes, the op's row is linked as not compared.
        row = self.wait(".vrow.selected")
        self.assertIn(f"#{linear['op_index']} aten::linear", row.text)
        self.assertEqual(row.find_element(By.CSS_SELECTOR, ".link").text, "○")
        self.shot("trusted-details.png")

    def test_replica_check_names_the_differing_replica_and_opens_its_op(self):
        # Rank 1's copy of a reduced gradient is corrupted after the
        # all-reduce at step 1: only the replica check sees it.
        harness.train(self.site, self.daemon, "sdc", ranks=RANKS, steps=STEPS, fault="sdc:1:1")
        group = self.daemon.cli_json("ranks", "sdc", "--replicas", "0,1")["replicas"][0]
        first = group["first_divergence"]
        self.assertEqual((group["status"], first["rank"], first["step"]), ("diverged", 1, 1))
        self.open("/run", name="sdc", replicas="0,1")
        shown = self.wait("#replicas .replica-group[data-status=diverged]")
        self.assertIn(f"replicas 0, 1 · {group['compared_ops']:,} replicated op(s) compared", shown.text)
        pivot = shown.find_element(By.CSS_SELECTOR, ".replica-pivot")
        self.assertIn(f"rank 1 · step 1 · {first['op']} · train_gpt.py:{first['site']['suspect']['line']}",
                      pivot.text)
        self.shot("replicas.png")
        # Its link opens rank 1's ops at that op, with its details. The
        # selected row shows "…" (loading) until its page of ops arrives.
        pivot.find_element(By.TAG_NAME, "a").click()
        label = f"#{first['op_index']['suspect']} {first['op']}"
        WebDriverWait(self.driver, 60).until(lambda d: d.execute_script(
            "const r = document.querySelector('.vrow.selected');"
            "return r !== null && r.textContent.startsWith(arguments[0]);", label))
        self.assertTrue(self.in_viewport(self.driver.find_element(By.CSS_SELECTOR, ".vrow.selected")))
        self.assertIn("Rank 1", self.driver.find_element(By.CSS_SELECTOR, "#ops h3").text)
        WebDriverWait(self.driver, 60).until(lambda d: d.execute_script(
            "const t = document.querySelector('#details table.details');"
            "return t !== null && t.textContent.includes(arguments[0]);", first["op"]))
        # Ranks that are not numbers: the daemon's one-line error.
        field = self.driver.find_element(By.CSS_SELECTOR, "#replicas input[name=replicas]")
        field.clear()
        field.send_keys("0,x")
        self.driver.find_element(By.CSS_SELECTOR, "#replicas button").click()
        error = self.wait("#replicas .replica-result .error")
        self.assertEqual(error.text, "replicas must be rank numbers separated by commas")

    def test_collectives_matrix_marks_the_desync(self):
        with self.assertRaisesRegex(AssertionError, harness.TIMEOUT_EXIT):
            harness.train(self.site, self.daemon, "desync", ranks=RANKS, steps=STEPS, fault="desync:1:1",
                          timeout=180, args=["--timeout", "5"])
        report = self.daemon.cli_json("collectives", "desync")
        self.assertEqual(len(report["desyncs"]), 1, json.dumps(report)[:2000])
        desync = report["desyncs"][0]
        self.open("/run", name="desync")
        matrix = self.wait("table.matrix[data-communicator=world]")
        cells = matrix.find_elements(By.CSS_SELECTOR, "td[data-state=desync]")
        self.assertEqual(sorted(c.get_attribute("data-seq") for c in cells), [str(desync["seq"])] * RANKS)
        self.assertIn("1 desync(s)", self.driver.find_element(By.CSS_SELECTOR, "#collectives h3").text)
        # The first row names each column's kind, as the report's runs of kinds say.
        kinds = {c.get_attribute("data-seq"): c.get_attribute("data-kind")
                 for c in matrix.find_elements(By.CSS_SELECTOR, "tr.kinds td")}
        self.assertEqual(kinds[str(desync["seq"])], desync["members"][0]["kind"])
        world = next(c for c in report["live"] if c["name"] == "world")
        for run in world["kinds"]:
            for seq in {run["from_seq"], run["to_seq"]} & {int(s) for s in kinds}:
                self.assertEqual(kinds[str(seq)], run["kind"])
        self.assertGreater(len(set(kinds.values()) - {""}), 1, kinds)
        self.assertIn("diverged", self.driver.find_element(By.ID, "cross-rank").text)
        # The rank's ops are listed; a click shows an op's details and source.
        self.wait(".vlist.ops .orow").click()
        self.wait("#details .source .line.hl")
        self.shot("collectives-desync.png")


class MillionOps(ViewerTestCase):
    """One rank of a million ops in each of two synthetic runs that diverge
    near the end: the alignment is paged by range, the DOM stays small."""

    @classmethod
    def record(cls):
        started = time.time()
        # A buffer that holds the whole burst: loadgen records faster than
        # the daemon acknowledges, and a dropped record would be a gap.
        env = dict(os.environ, OPGUARD_BUFFER_MB="1024")
        for run, extra in (("big-ref", []), ("big-sus", ["--diverge-at", f"0:{BIG_OPS - 10}"])):
            sent = subprocess.run([os.environ["OPGUARD_LOADGEN"], "--run", run, "--ranks", "1", "--ops", str(BIG_OPS),
                                   "--endpoint", cls.daemon.ingest, *extra],
                                  check=True, capture_output=True, text=True, timeout=300, env=env)
            if "all acknowledged: yes" not in sent.stdout:
                raise AssertionError(f"loadgen lost records of {run}: {sent.stdout[-500:]}")
        cls.record_s = time.time() - started

    def rows(self):
        """The texts of the list rows in the DOM, read in one go (the list
        redraws while it scrolls, which makes element handles stale)."""
        return self.driver.execute_script(
            "return [...document.querySelectorAll('.vlist .vrow')].map((r) => r.textContent);")

    def row_in_view(self, prefix):
        return self.driver.execute_script(
            "const l = document.querySelector('.vlist').getBoundingClientRect();"
            "const r = [...document.querySelectorAll('.vlist .vrow')].find((r) => r.textContent.startsWith("
            "arguments[0]));"
            "if (!r) return false; const b = r.getBoundingClientRect();"
            "return b.top >= l.top && b.bottom <= l.bottom;", prefix)

    def scroll_to_end(self, css):
        self.driver.execute_script(f"const l = document.querySelector('{css}'); l.scrollTop = l.scrollHeight;")

    def test_alignment_of_a_million_ops_scrolls_to_the_end(self):
        started = time.time()
        self.open("/diff", reference="big-ref", suspect="big-sus")
        pivot = self.wait(".arow.pivot", timeout=120)
        self.assertIn(f"#{BIG_OPS - 10} ", pivot.text)
        self.assertIn(f"{BIG_OPS:,} rows", self.driver.find_element(By.ID, "lanes").text)
        self.scroll_to_end(".vlist.alignment")
        WebDriverWait(self.driver, 30).until(lambda d: any(f"#{BIG_OPS - 1} " in r for r in self.rows()))
        self.assertLess(len(self.rows()), 100, "only the visible rows are in the DOM")
        self.shot("million-ops-alignment.png")
        print(f"\nmillion-op alignment: recorded 2 runs in {self.record_s:.1f} s, "
              f"viewer to last row {time.time() - started:.1f} s")

    def test_ops_list_of_a_million_ops_scrolls_to_the_end(self):
        self.open("/run", name="big-sus", rank=0)
        self.wait(".vlist.ops .orow")
        self.scroll_to_end(".vlist.ops")
        WebDriverWait(self.driver, 30).until(lambda d: self.row_in_view(f"#{BIG_OPS - 1} "))
        self.assertLess(len(self.rows()), 100)


if __name__ == "__main__":
    unittest.main()
