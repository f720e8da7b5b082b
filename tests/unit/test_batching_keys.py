"""The [batching] keys come from one table (batching/config.KEYS); orch's settings section is built from it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError, create_model

from orchestrator.batching.config import DEFAULTS, KEYS, Key, normalize
from orchestrator.config import BatchingSection, _batching_field, load_settings
from orchestrator.errors import ConfigError


def test_the_section_has_the_tables_keys_defaults_and_docs():
    fields = BatchingSection.model_fields
    assert list(fields) == list(KEYS)
    for name, key in KEYS.items():
        assert fields[name].default == key.default == DEFAULTS[name]
        assert fields[name].description == key.doc
    assert BatchingSection().model_dump() == normalize({})


@pytest.mark.parametrize("name, bad, message", [
    ("num_buckets", 300, "less than or equal to 256"),
    ("seed", -1, "greater than or equal to 0"),
    ("target_efficiency", 0, "greater than 0"),
    ("strategy", "fast", "'sorted', 'shuffle', 'bucketed' or 'megabatch'"),
    ("megabatch", 0, "greater than or equal to 1"),
])
def test_orch_toml_and_the_training_side_refuse_the_same_values(tmp_path, name, bad, message):
    """A value the run's normalize() would refuse is refused by orch before anything reaches the target."""
    with pytest.raises(ValueError, match=f"batching.{name} must"):
        normalize({name: bad})
    cfg = tmp_path / "orch.toml"
    cfg.write_text(f"[batching]\n{name} = {bad!r}\n".replace("'", '"'))
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env={})
    assert f"batching.{name}" in err.value.message and message in err.value.message, err.value.message


def test_a_key_of_the_table_becomes_a_typed_bounded_optional_field():
    annotation, field = _batching_field(Key(int, None, "chunks per step", minimum=2, maximum=9))
    model = create_model("M", chunks=(annotation, field))
    assert model().chunks is None and model(chunks=5).chunks == 5
    for bad in (1, 10, "many"):
        with pytest.raises(ValidationError):
            model(chunks=bad)
    annotation, field = _batching_field(Key(str, "a", "mode", choices=("a", "b")))
    model = create_model("N", mode=(annotation, field))
    assert model(mode="b").mode == "b"
    with pytest.raises(ValidationError, match="'a' or 'b'"):
        model(mode="c")


def test_the_cross_key_checks_stay():
    with pytest.raises(ValidationError, match="must be at least max_seq_len"):
        BatchingSection(token_budget=100, max_seq_len=200)
    with pytest.raises(ValidationError, match="ascending boundaries"):
        BatchingSection(buckets=[0, 5, 5])
