"""Node-name folding for exec output and summaries (gpu-node-[1-3], as clush prints it)."""

from __future__ import annotations

import pytest

from trainfleet.nodeset import fold_groups, fold_names

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("names", "folded"),
    [
        ([], ""),
        (["login"], "login"),
        (["gpu-node-1"], "gpu-node-1"),
        (["gpu-node-1", "gpu-node-2", "gpu-node-3"], "gpu-node-[1-3]"),
        (["gpu-node-3", "gpu-node-1", "gpu-node-2"], "gpu-node-[1-3]"),
        (["n1", "n2", "n4", "n5", "n7"], "n[1-2,4-5,7]"),
        (["n1", "n1", "n2"], "n[1-2]"),
        (["node01", "node02", "node03"], "node[01-03]"),
        (["node08", "node09", "node10"], "node[08-10]"),
        (["node01", "node1"], "node[01,1]"),  # different names: padding kept apart
        (["rack1-gpu1", "rack1-gpu2", "rack2-gpu1"], "rack1-gpu[1-2],rack2-gpu1"),
        (["gpu1a", "gpu2a", "gpu1b"], "gpu[1-2]a,gpu1b"),
        (["10.0.0.1", "10.0.0.2", "10.0.0.3"], "10.0.0.[1-3]"),
    ],
)
def test_fold_names(names, folded):
    assert fold_names(names) == folded


def test_mixed_prefixes_keep_order_of_first_appearance():
    names = ["b2", "login", "a1", "b1", "a2", "master"]
    assert fold_names(names) == "b[1-2],login,a[1-2],master"


def test_names_without_numbers_stay_whole_and_in_order():
    assert fold_names(["head", "login", "head"]) == "head,login,head"


@pytest.mark.parametrize(
    ("names", "folded"),
    [
        (["fe80::1", "fe80::2"], "fe80::1,fe80::2"),
        (["fe80::1", "n1", "n2"], "fe80::1,n[1-2]"),
        (["2001:db8::10", "2001:db8::11"], "2001:db8::10,2001:db8::11"),
    ],
)
def test_ipv6_addresses_stay_whole(names, folded):
    assert fold_names(names) == folded


def test_unpadded_range_crossing_a_digit_boundary():
    assert fold_names([f"gpu-node-{i}" for i in range(1, 13)]) == "gpu-node-[1-12]"


def test_fold_groups_by_equal_value_in_first_appearance_order():
    values = {
        "gpu-node-1": "ok",
        "gpu-node-2": "ok",
        "gpu-node-3": "down",
        "gpu-node-4": "ok",
        "login": "down",
    }
    assert fold_groups(values) == [("gpu-node-[1-2,4]", "ok"), ("gpu-node-3,login", "down")]


def test_fold_groups_with_tuple_values():
    values = {"a1": ("x\n", ""), "a2": ("x\n", ""), "a3": ("y\n", "")}
    assert fold_groups(values) == [("a[1-2]", ("x\n", "")), ("a3", ("y\n", ""))]


def test_fold_groups_empty():
    assert fold_groups({}) == []
