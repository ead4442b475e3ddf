"""Configuration sources and start-up errors."""

import re
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from inferwire import backends
from inferwire.backends import backend_class
from inferwire.config import load_settings
from inferwire.core.errors import ConfigurationError, MissingDependencyError
from inferwire.server import InferwireServer
from tests.support.fake_backend import FakeBackend


def test_no_file_declares_the_bundled_model_and_its_adapter_loaded_at_startup(monkeypatch):
    for key in [k for k in __import__("os").environ if k.startswith("INFERWIRE_")]:
        monkeypatch.delenv(key)
    settings = load_settings()
    assert settings.server.address == "0.0.0.0:50051"
    [model, adapter] = settings.models
    assert (model.name, model.backend, model.load_on_startup) == (
        "demo",
        "onnxruntime-genai",
        True,
    )
    assert model.options == {"path": "builtin", "device": "cpu"}
    assert (adapter.name, adapter.adapter_of, adapter.backend) == (
        "demo-sonnets",
        "demo",
        "onnxruntime-genai",
    )
    assert adapter.load_on_startup
    assert Path(adapter.options["adapter_file"]).name == "sonnets.onnx_adapter"


def test_flags_beat_environment_which_beats_the_file(tmp_path, monkeypatch):
    config = tmp_path / "inferwire.yaml"
    config.write_text(
        textwrap.dedent(
            """
            server:
              address: 127.0.0.1:7001
              grace_period_s: 3
              max_prompt_bytes: 1000
            models:
              - name: tiny
                options: {path: builtin}
            """
        )
    )
    from_file = load_settings(config)
    assert from_file.server.address == "127.0.0.1:7001"
    assert [m.name for m in from_file.models] == ["tiny"]

    monkeypatch.setenv("INFERWIRE_SERVER__ADDRESS", "127.0.0.1:7002")
    monkeypatch.setenv("INFERWIRE_SERVER__GRACE_PERIOD_S", "9")
    from_env = load_settings(config)
    assert from_env.server.address == "127.0.0.1:7002"
    assert from_env.server.grace_period_s == 9
    assert from_env.server.max_prompt_bytes == 1000  # untouched keys keep the file's value

    from_flags = load_settings(config, server={"address": "127.0.0.1:7003"})
    assert from_flags.server.address == "127.0.0.1:7003"
    assert from_flags.server.grace_period_s == 9


def test_unknown_backend_is_a_startup_error_listing_the_available_ones():
    settings = load_settings(models=[{"name": "m", "backend": "tensorflow"}])
    expected = r"unknown backend 'tensorflow'.*onnxruntime-genai"
    with pytest.raises(ConfigurationError, match=expected):
        InferwireServer(settings, address="127.0.0.1:0")


def test_unknown_backend_option_is_a_configuration_error_naming_the_key():
    with pytest.raises(ConfigurationError) as error:
        load_settings(models=[{"name": "m", "options": {"pth": "builtin"}}], backends=backend_class)
    assert str(error.value) == "models[0].options.pth: unknown key"


def test_without_a_backend_lookup_options_wait_for_the_server():
    """Settings import no backend (the doors import settings): the CLI hands the lookup in,
    and without it a model's options are the backend's to check when the server starts."""
    settings = load_settings(models=[{"name": "m", "options": {"pth": "builtin"}}])
    with pytest.raises(ConfigurationError, match=r"options\.pth"):
        InferwireServer(settings, address="127.0.0.1:0")


def test_every_unknown_key_is_reported_at_once_in_one_style():
    """Top-level keys, model keys and each backend's options in one error, not in rounds."""
    with pytest.raises(ConfigurationError) as error:
        load_settings(
            backends=backend_class,
            servr={},
            server={"adress": "x"},
            models=[
                {"name": "a", "optons": {}},
                {"name": "b", "options": {"pth": "builtin", "device": "gpu"}},
                {"name": "c", "backend": "triton", "options": {"urll": "x"}},
            ],
        )
    assert str(error.value).split("; ") == [
        "server.adress: unknown key",
        "models[0].optons: unknown key",
        "models[1].options.device: Input should be 'cpu' or 'cuda'",
        "models[1].options.pth: unknown key",
        "models[2].options.urll: unknown key",
        "servr: unknown key",
    ]


def test_options_of_a_backend_not_resolved_at_load_time_are_left_to_start_up():
    settings = load_settings(models=[{"name": "m", "backend": "tensorflow", "options": {"x": 1}}])
    assert settings.models[0].options == {"x": 1}


def test_missing_backend_sdk_names_the_extra_to_install(monkeypatch):
    # Make the SDK import fail for real, as on a machine without the package.
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)
    with pytest.raises(
        MissingDependencyError, match=r"pip install 'inferwire\[onnxruntime-genai\]'"
    ):
        backend_class("onnxruntime-genai")


def test_duplicate_model_names_are_rejected():
    with pytest.raises(ConfigurationError, match=r"^models: model 'a' is declared twice$"):
        load_settings(models=[{"name": "a"}, {"name": "a"}])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"server": {"grace_period_s": -1}},
            "server.grace_period_s: Input should be greater than or equal to 0",
        ),
        (
            {"models": [{"name": "ok"}, {"name": "bad name"}]},
            "models[1].name: ' ' (character 4) is not allowed: a model name holds only "
            "letters, digits, '.', '_' and '-'",
        ),
        ({"server": {"adress": "x"}}, "server.adress: unknown key"),
        (
            {"server": {"log_level": "LOUD"}},
            "server.log_level: Input should be 'CRITICAL', 'ERROR', 'WARNING', 'INFO' or 'DEBUG'",
        ),
        (
            {"server": {"grace_period_s": -1, "log_format": "xml"}},
            "server.grace_period_s: Input should be greater than or equal to 0; "
            "server.log_format: Input should be 'auto', 'json' or 'text'",
        ),
    ],
)
def test_configuration_errors_name_the_key_and_the_problem_in_one_line(overrides, message):
    with pytest.raises(ConfigurationError) as error:
        load_settings(**overrides)
    assert str(error.value) == message


@pytest.mark.parametrize("level", ["debug", "Warning", "ERROR"])
def test_log_level_is_a_python_level_name_in_any_case(level):
    assert load_settings(server={"log_level": level}).server.log_level == level.upper()


@pytest.mark.parametrize(
    "address",
    ["0.0.0.0:50051", "127.0.0.1:0", "localhost:65535", "[::]:50051", "[::1]:6000", "unix:/tmp/s"],
)
def test_listen_addresses_with_a_port_are_accepted(address):
    assert load_settings(server={"address": address}).server.address == address


@pytest.mark.parametrize(
    "address", ["localhost", "0.0.0.0", ":50051", "localhost:65536", "::1:50051", "host:port"]
)
def test_a_listen_address_without_a_valid_port_is_a_configuration_error(address):
    with pytest.raises(ConfigurationError) as error:
        load_settings(server={"address": address})
    assert str(error.value) == (
        "server.address: must be host:port with a port from 0 to 65535 (for example "
        f"0.0.0.0:50051 or [::]:50051), got {address!r}"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "server: [\n  bad",
            r"bad\.yaml, line 2, column 6: not valid YAML: expected ',' or '\]'",
        ),
        ("- a\n- b\n", r"bad\.yaml: the top level must be a mapping \(server:, models:\)"),
    ],
)
def test_a_file_that_is_not_a_yaml_mapping_is_a_one_line_configuration_error(
    tmp_path, content, message
):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    with pytest.raises(ConfigurationError, match=message) as error:
        load_settings(config)
    assert "\n" not in str(error.value)


def test_a_missing_file_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match=r"configuration file .*nope\.yaml not found"):
        load_settings(tmp_path / "nope.yaml")


def test_exit_on_startup_failure_defaults_on_and_the_environment_turns_it_off(monkeypatch):
    assert load_settings().server.exit_on_startup_failure is True
    monkeypatch.setenv("INFERWIRE_SERVER__EXIT_ON_STARTUP_FAILURE", "false")
    assert load_settings().server.exit_on_startup_failure is False


def plugin(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=backends.ENTRY_POINT_GROUP)


def test_a_backend_from_the_entry_point_group_is_resolved_and_listed(monkeypatch):
    found = [plugin("scripted", "tests.support.fake_backend:FakeBackend")]
    monkeypatch.setattr(backends, "entry_points", lambda group: found)
    assert backends.backend_class("scripted") is FakeBackend
    assert "scripted" in backends.available_backends()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tests.support.fake_backend:FakeBackends", "not a subclass of Backend"),
        ("inferwire_no_such_package:Backend", "could not be imported"),
    ],
)
def test_a_broken_backend_plugin_is_a_startup_error(monkeypatch, value, message):
    monkeypatch.setattr(backends, "entry_points", lambda group: [plugin("bad", value)])
    with pytest.raises(ConfigurationError, match=message):
        backends.backend_class("bad")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("demo/x", "'/' (character 5) is not allowed"),
        ("a b", "' ' (character 2) is not allowed"),
        ("demo\n", "'\\n' (character 5) is not allowed"),
        ("-demo", "must start with a letter or digit (A-Z, a-z, 0-9), not '-'"),
        ("é", "must start with a letter or digit (A-Z, a-z, 0-9), not 'é'"),
    ],
)
def test_a_model_name_that_is_refused_names_the_character_at_fault(name, problem):
    with pytest.raises(ConfigurationError) as error:
        load_settings(models=[{"name": name}])
    assert str(error.value).startswith(f"models[0].name: {problem}")


def test_memory_sizes_take_binary_units_and_plain_bytes(tmp_path):
    config = tmp_path / "memory.yaml"
    config.write_text(
        "server:\n"
        "  memory:\n"
        "    budgets: {cpu: 2GiB, 'cuda:0': 70GiB}\n"
        "    load_wait_s: 5\n"
        "    min_resident_s: 0\n"
        "models:\n"
        "  - {name: demo, pinned: true}\n"
        "  - {name: poet, on_demand: true, idle_unload_s: 600, memory_bytes: 300MiB}\n"
        "  - {name: tiny, memory_bytes: 4096}\n"
    )
    settings = load_settings(config)
    memory = settings.server.memory
    assert memory.budgets == {"cpu": 2 << 30, "cuda:0": 70 << 30}
    assert (memory.load_wait_s, memory.min_resident_s) == (5, 0)
    demo, poet, tiny = settings.models
    assert demo.pinned and not demo.on_demand
    assert poet.on_demand and poet.idle_unload_s == 600 and poet.memory_bytes == 300 << 20
    assert tiny.memory_bytes == 4096


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"server": {"memory": {"budgets": {"cpu": "2 gigs"}}}}, "server.memory.budgets.cpu"),
        ({"models": [{"name": "m", "memory_bytes": "-5MiB"}]}, "models[0].memory_bytes"),
        ({"models": [{"name": "m", "memory_bytes": -1}]}, "models[0].memory_bytes"),
    ],
)
def test_a_bad_size_is_a_start_up_error_naming_the_key(overrides, key):
    with pytest.raises(ConfigurationError, match=re.escape(key) + ": .*size"):
        load_settings(**overrides)
