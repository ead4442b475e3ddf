"""Start-up without the Triton SDK: needs no Triton server, so it always runs."""

import subprocess
import sys
import textwrap


def test_missing_tritonclient_fails_at_startup_naming_the_extra(tmp_path):
    config = tmp_path / "triton.yaml"
    config.write_text(
        textwrap.dedent(
            """
            models:
              - name: llm
                backend: triton
                options: {url: "127.0.0.1:1"}
            """
        )
    )
    # A real start-up in a fresh interpreter where tritonclient cannot be imported.
    hide_and_serve = (
        "import sys\n"
        "for name in ('tritonclient', 'tritonclient.grpc', 'tritonclient.grpc.aio'):\n"
        "    sys.modules[name] = None\n"
        "from inferwire.cli import main\n"
        f"sys.argv = ['inferwire', 'serve', '--config', {str(config)!r},"
        " '--address', '127.0.0.1:0']\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", hide_and_serve], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'inferwire[triton]'" in result.stderr
