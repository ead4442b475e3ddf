"""What the echo models share, free of Triton: the generation and a thread per request.

The models import it as `echo_engine` through a symlink next to each model.py (Triton's
Python backend stub puts the model's version folder on sys.path); the Triton tests
import it as `tests.triton_models.echo_engine` to know what the models generate.
See README.md for the rules.
"""

import json
import os
import threading
import time


def echo_token(words, index):
    """Token `index`: the prompt word at that position, cycling, reversed."""
    return words[index % len(words)][::-1]


def echo_text(prompt, tokens):
    """The text of the first `tokens` tokens, joined with single spaces."""
    words = prompt.split() or ["?"]
    return " ".join(echo_token(words, i) for i in range(tokens))


# A prompt whose first word is `fail:<CODE>` (a pb_utils.TritonError code name, such as
# NOT_FOUND, INVALID_ARG, UNAVAILABLE or CANCELLED) makes the model answer with that error.
FAIL_PREFIX = "fail:"


class RequestedFailure(Exception):
    """The prompt asked for an error with Triton code `code` (a TritonError attribute)."""

    def __init__(self, code):
        super().__init__(f"failing on request with {code}")
        self.code = code


def check_requested_failure(prompt):
    """Raise RequestedFailure when the prompt's first word is `fail:<CODE>`."""
    words = prompt.split()
    if words and words[0].startswith(FAIL_PREFIX):
        raise RequestedFailure(words[0][len(FAIL_PREFIX) :])


def token_delay_s():
    return float(os.environ.get("INFERWIRE_TRITON_TOKEN_DELAY_S", "0.005"))


class Generation:
    """One request's generation: its rules, and the text, tokens and finish so far."""

    def __init__(self, prompt, max_tokens, stops, include_stop):
        self.prompt = prompt
        self.words = prompt.split() or ["?"]
        self.max_tokens = max_tokens
        self.stops = stops
        self.include_stop = include_stop
        self.text = ""
        self.tokens = 0
        self.finish = None
        self.cancelled = False

    def run(self, is_cancelled, delay_s):
        """Generate token by token; yield the text each token added to `text`.

        Ends on cancellation (`cancelled`), at `max_tokens` (finish `length`), after three
        times the prompt's words (`stop`), or when a stop string appears in the text
        (`stop`): the text is cut at the stop string, or after it with `include_stop`.
        """
        natural_end = 3 * len(self.words)
        while True:
            if is_cancelled():
                self.cancelled = True
                return
            if self.tokens >= self.max_tokens:
                self.finish = "length"
                return
            if self.tokens >= natural_end:
                self.finish = "stop"
                return
            time.sleep(delay_s)
            before = len(self.text)
            word = echo_token(self.words, self.tokens)
            self.text = f"{self.text} {word}" if self.text else word
            self.tokens += 1
            for stop in self.stops:
                index = self.text.find(stop)
                if index >= 0:
                    end = index + len(stop) if self.include_stop else index
                    self.text = self.text[:end]
                    self.finish = "stop"
                    break
            yield self.text[before:]
            if self.finish is not None:
                return

    def record(self, model, request_id, stream, params, forwarded=None):
        """Write what the request did to $INFERWIRE_TRITON_RECORD_DIR, if set.

        `forwarded`: the request parameters Triton made from gRPC headers
        (--grpc-header-forward-pattern), such as the caller's `traceparent`.
        """
        directory = os.environ.get("INFERWIRE_TRITON_RECORD_DIR")
        if not directory or not request_id:
            return
        record = {
            "tokens": self.tokens,
            "cancelled": self.cancelled,
            "finish": self.finish,
            "stream": stream,
            "params": params,
            "prompt": self.prompt,
            "forwarded": forwarded or {},
        }
        path = os.path.join(directory, f"{model}-{request_id}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)


class ThreadPerRequest:
    """`execute` for a decoupled model: each request generates on a thread of its own.

    A subclass defines `_generate(request, sender)` and `_fail(sender, message, code)`,
    where `code` names a pb_utils.TritonError code (None: Triton's default, INTERNAL).
    """

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._run, args=(request,), daemon=True).start()
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        try:
            self._generate(request, sender)
        except RequestedFailure as exc:
            self._fail(sender, str(exc), exc.code)
        except Exception as exc:
            self._fail(sender, f"{type(exc).__name__}: {exc}", None)
