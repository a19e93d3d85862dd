import json

from hypothesis import given, settings
from hypothesis import strategies as st

from envace import fidelity as f

REAL = json.dumps({"id": 3, "tags": ["a", "b"], "user": {"name": "ana", "score": 10.0}})


def test_identical_and_reordered_keys():
    same = json.dumps({"user": {"score": 10.0, "name": "ana"}, "tags": ["a", "b"], "id": 3}, indent=2)
    for metric in (f.exact_match, f.structure_f1, f.value_accuracy, f.string_similarity):
        assert metric(REAL, REAL) == 1.0
        assert metric(REAL, same) == 1.0, metric.__name__


def test_missing_and_extra_keys():
    missing = json.dumps({"id": 3, "tags": ["a", "b"], "user": {"name": "ana"}})
    extra = json.dumps({"id": 3, "tags": ["a", "b"], "user": {"name": "ana", "score": 10.0}, "ok": True})
    assert f.exact_match(REAL, missing) == 0.0
    # REAL has 6 paths ($.id $.tags $.tags[] $.user $.user.name $.user.score); `missing` lacks one
    assert f.structure_f1(REAL, missing) == 2 * 5 / (6 + 5)
    assert f.value_accuracy(REAL, missing) == 4 / 5  # 5 leaves (id, tags[0], tags[1], name, score)
    assert f.structure_f1(REAL, extra) == 2 * 6 / (6 + 7)
    assert f.value_accuracy(REAL, extra) == 1.0  # extra keys cost structure, not recall of real values


def test_numeric_near_miss_and_type_change():
    near = json.dumps({"id": 3, "tags": ["a", "b"], "user": {"name": "ana", "score": 10.001}})
    far = json.dumps({"id": 3, "tags": ["a", "b"], "user": {"name": "ana", "score": 11}})
    typed = json.dumps({"id": "3", "tags": ["a", "b"], "user": {"name": "ana", "score": 10.0}})
    assert f.value_accuracy(REAL, near) == 1.0 and f.exact_match(REAL, near) == 0.0
    assert f.value_accuracy(REAL, far) == 4 / 5
    assert f.value_accuracy(REAL, typed) == 4 / 5


def test_error_agreement():
    assert f.error_agreement(True, True) == "both_error"
    assert f.error_agreement(False, False) == "both_ok"
    assert f.error_agreement(False, True) == "false_error"
    assert f.error_agreement(True, False) == "missed_error"
    assert f.error_agreement(True, None) == "no_rehearsal"  # a malformed rehearsal agrees with nothing
    assert f.score_pair("x", None, True, None, [])["error_agree"] == 0.0


def test_non_json_and_missing_rehearsals():
    assert f.valid_json("None") == 0.0 and f.valid_json('{"a": 1}') == 1.0 and f.valid_json(None) == 0.0
    assert f.exact_match("None", "None") == 1.0  # BFCL returns the text None; compared as a string
    assert f.structure_f1("hello", "world") == 1.0 and f.structure_f1("hello", "3") == 0.0
    for metric in (f.exact_match, f.structure_f1, f.value_accuracy, f.string_similarity):
        assert metric(REAL, None) == 0.0


def test_copy_rate_flags_verbatim_examples():
    assert f.copied('{"b": 2, "a": 1}', ['{"a":1,"b":2}', "x"])
    assert not f.copied('{"a": 1}', ['{"a": 2}'])
    assert not f.copied(None, ["x"])


texts = st.none() | st.text(max_size=200) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30).map(lambda v: json.dumps(v))


@settings(max_examples=300, deadline=None)
@given(texts, texts, st.booleans(), st.booleans())
def test_metrics_never_raise_and_stay_in_range(real, rehearsed, e1, e2):
    scores = f.score_pair(real, rehearsed, e1, e2, [real or ""])
    for key in ("valid_json", "exact", "structure_f1", "value_acc", "string_sim", "error_agree"):
        assert 0.0 <= scores[key] <= 1.0
    if real is not None:
        assert f.exact_match(real, real) == 1.0 and f.value_accuracy(real, real) == 1.0


def test_huge_and_deep_values_do_not_raise():
    deep = "[" * 5000 + "]" * 5000
    big = json.dumps({"k": "x" * 200_000})
    assert 0.0 <= f.structure_f1(deep, deep) <= 1.0
    assert f.exact_match(big, big) == 1.0 and 0.99 <= f.string_similarity(big, big[:-5] + 'y"}') <= 1.0
