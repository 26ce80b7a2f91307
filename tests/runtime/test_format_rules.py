"""`safe_names`: PyTorch's state-dict keys (any text) as saved variable
names, each valid and no two equal once sanitised; valid keys unchanged."""

import pytest

from runtime.format_rules import check_collisions, check_name, safe_names

KEYS = {
    "dashed module": ["main.initial-conv-3-64.weight", "main.initial-conv-3-64.bias"],
    "sanitised collision": ["encoder.level2_0.c1.weight", "encoder.level2.0.c1.weight"],
    "renamed onto a valid key": ["a-b.w", "a_b.w", "a_b.w_1"],
    "spaces, slashes, empty parts": ["bn 1.weight", "relu/1.x", "odd..name", ".lead", "trail."],
    "not NFKC": ["ﬁlter.weight", "filter.weight"],
    "too long": ["x" * 300 + ".weight", "x" * 300 + ".bias"],
}


@pytest.mark.parametrize("case", sorted(KEYS))
def test_each_key_gets_a_valid_distinct_name(case):
    keys = KEYS[case]
    names = safe_names(keys)
    assert set(names) == set(keys)
    for key, name in names.items():
        check_name(name, "test")
    check_collisions(names.values(), "test")
    assert safe_names(list(keys)) == names  # the same for every trace of a module


@pytest.mark.parametrize("keys, expected", [
    (["main.initial-conv-3-64.weight"], {"main.initial-conv-3-64.weight": "main.initial_conv_3_64.weight"}),
    # The first of two colliding valid keys keeps its name, in the order given.
    (["level2_0.w", "level2.0.w"], {"level2_0.w": "level2_0.w", "level2.0.w": "level2.0.w_1"}),
    (["level2.0.w", "level2_0.w"], {"level2.0.w": "level2.0.w", "level2_0.w": "level2_0.w_1"}),
    # A valid key is never renamed for an invalid one's sake, wherever it comes.
    (["a-b.w", "a_b.w", "a_b.w_1"], {"a-b.w": "a_b.w_2", "a_b.w": "a_b.w", "a_b.w_1": "a_b.w_1"}),
    (["odd..name", "bn 1.w"], {"odd..name": "odd._.name", "bn 1.w": "bn_1.w"}),
])
def test_names_are_the_keys_where_valid(keys, expected):
    assert safe_names(keys) == expected
