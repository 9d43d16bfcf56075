"""The official `openai` Python client against a real `infer serve` (SmolLM2, loopback port).

Run by scripts/openai-check.sh (which installs the pinned client into a cached venv):
    INFER_BIN=target/release/infer INFER_MODELS=~/.cache/infer/models python -m unittest ...
"""

import os
import re
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import openai

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The prompt runs whole every time, so repeated greedy requests get the same logits (through
# the prefix cache they are equal only to rounding, which can flip a near-tie).
NO_CACHE = {"cache_prompt": False}


class ServerCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        binary = os.environ["INFER_BIN"]
        gguf = os.path.join(os.environ["INFER_MODELS"], MODEL_FILE)
        assert os.path.isfile(gguf), f"{gguf} missing (scripts/fetch-models.sh)"
        cls.tmp = tempfile.TemporaryDirectory()
        vx = os.path.join(cls.tmp.name, "smol.vindex")
        subprocess.run([binary, "extract", gguf, "-o", vx], check=True, capture_output=True)
        cls.proc = subprocess.Popen(
            [binary, "serve", vx, "--port", "0", "--parallel", "4", "--ctx-size", "256",
             "--api-key", "test-key"],
            stderr=subprocess.PIPE, text=True)
        port = None
        for line in cls.proc.stderr:
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "no port announced"
        threading.Thread(target=lambda: [None for _ in cls.proc.stderr], daemon=True).start()
        cls.base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(cls.base + "/health") as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.1)
        cls.client = openai.OpenAI(base_url=cls.base + "/v1", api_key="test-key", max_retries=0)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        assert cls.proc.wait(timeout=60) == 0, "infer serve did not exit 0 on SIGTERM"
        cls.tmp.cleanup()

    def chat(self, **kw):
        return self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=10, temperature=0, extra_body=NO_CACHE, **kw)

    def test_chat_streamed_equals_non_streamed(self):
        full = self.chat()
        text = full.choices[0].message.content
        self.assertTrue(text)
        self.assertEqual(full.choices[0].message.role, "assistant")
        self.assertIn(full.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(full.usage.total_tokens,
                         full.usage.prompt_tokens + full.usage.completion_tokens)
        chunks = list(self.chat(stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(streamed, text)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertEqual(finishes[-1], full.choices[0].finish_reason)
        self.assertTrue(all(f is None for f in finishes[:-1]))
        self.assertEqual(chunks[-1].usage.completion_tokens, full.usage.completion_tokens)

    def test_completions_and_logprobs(self):
        r = self.client.completions.create(model=self.model, prompt="The sky is",
                                           max_tokens=6, temperature=0, logprobs=2,
                                           extra_body=NO_CACHE)
        self.assertEqual(r.usage.completion_tokens, 6)
        self.assertEqual(len(r.choices[0].logprobs.tokens), 6)
        self.assertEqual("".join(r.choices[0].logprobs.tokens), r.choices[0].text)
        streamed = "".join(c.choices[0].text for c in self.client.completions.create(
            model=self.model, prompt="The sky is", max_tokens=6, temperature=0, stream=True,
            extra_body=NO_CACHE))
        self.assertEqual(streamed, r.choices[0].text)
        c = self.chat(logprobs=True, top_logprobs=2)
        for e in c.choices[0].logprobs.content:
            self.assertEqual(e.token, e.top_logprobs[0].token)

    def test_errors_map_to_client_exceptions(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(top_p=5)
        self.assertIn("top_p", str(e.exception))
        with self.assertRaises(openai.NotFoundError):
            self.client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "x"}])
        bad = openai.OpenAI(base_url=self.base + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()
        self.assertTrue(self.chat().choices[0].message.content)


if __name__ == "__main__":
    unittest.main()
