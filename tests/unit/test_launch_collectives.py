"""The hang report's collective, from Flight Recorder summaries as the shim writes them (the
real ones come from gloo in tests/unit/test_node_shim.py and the sandbox hang tests)."""

from __future__ import annotations

import pytest

from trainfleet.launch.collectives import describe, none_stuck, stuck_collectives

pytestmark = pytest.mark.unit

NODES = {0: "gpu-node-1", 1: "gpu-node-1", 2: "gpu-node-2", 3: "gpu-node-2"}


def _entry(seq, op="all_reduce", sizes=((1024,),), pg=0, name="default_pg"):
    return {"pg_id": pg, "pg_name": name, "collective_seq_id": seq, "is_p2p": False,
            "profiling_name": f"gloo:{op}", "input_sizes": [list(s) for s in sizes],
            "input_dtypes": ["BFloat16"]}  # fmt: skip


def _record(status, entries):
    return {"rank": 0, "pg_status": {str(pg): {"last_enqueued_collective": str(e),
                                               "last_completed_collective": str(c)}
                                     for pg, (e, c) in status.items()},
            "entries": entries}  # fmt: skip


def test_the_first_pending_collective_names_who_entered_and_who_never_did():
    records = {
        0: _record({0: (12, 11)}, [_entry(11), _entry(12)]),
        1: _record({0: (12, 11)}, [_entry(12)]),
        2: _record({0: (11, 11)}, [_entry(11)]),  # finished 11, never reached 12
        3: None,  # no answer: stopped
    }
    [stuck] = stuck_collectives(records, world_size=4)
    assert (stuck["seq"], stuck["op"], stuck["input_sizes"]) == (12, "all_reduce", [[1024]])
    assert (stuck["entered"], stuck["never_entered"], stuck["no_record"]) == ([0, 1], [2], [3])
    assert describe(stuck, NODES) == (
        "all_reduce #12 of process group 0 (default_pg), input sizes [[1024]] BFloat16: entered"
        " by ranks 0 (gpu-node-1), 1 (gpu-node-1); never entered by rank 2 (gpu-node-2);"
        " no record from rank 3 (gpu-node-2)"
    )


def test_ranks_in_the_same_collective_with_other_sizes_are_a_mismatch():
    records = {r: _record({0: (5, 4)}, [_entry(5, sizes=((1024,),))]) for r in range(3)}
    records[3] = _record({0: (5, 4)}, [_entry(5, op="all_gather", sizes=((256,),))])
    [stuck] = stuck_collectives(records, world_size=4)
    assert stuck["mismatch"] and stuck["never_entered"] == [] and stuck["no_record"] == []
    text = describe(stuck, NODES)
    assert "rank 3: gloo:all_gather [[256]]" in text and "the ranks disagree" in text


def test_every_rank_in_it_points_at_the_network():
    records = {r: _record({0: (5, 4)}, [_entry(5)]) for r in range(4)}
    [stuck] = stuck_collectives(records, world_size=4)
    assert not stuck["mismatch"]
    assert "every rank entered it: it does not complete" in describe(stuck, NODES)


def test_a_sub_group_is_judged_among_the_ranks_that_use_it():
    """Ranks 0 and 1 share a tensor-parallel group (pg 1); only rank 0 entered its 3rd op."""
    records = {
        0: _record({0: (7, 7), 1: (3, 2)}, [_entry(3, pg=1, name="tp")]),
        1: _record({0: (7, 7), 1: (2, 2)}, []),
        2: _record({0: (7, 7)}, []),
        3: _record({0: (7, 7)}, []),
    }
    [stuck] = stuck_collectives(records, world_size=4)
    assert (stuck["process_group"], stuck["pg_name"], stuck["seq"]) == ("1", "tp", 3)
    assert (stuck["entered"], stuck["never_entered"], stuck["no_record"]) == ([0], [1], [])


def test_nonsense_from_a_rank_is_no_record_not_a_crash():
    records = {
        0: _record({0: (5, 4)}, [_entry(5)]),
        1: {"pg_status": "garbage", "entries": 7},
        2: {"pg_status": {"0": {"last_enqueued_collective": "x"}}, "entries": ["?"]},
        3: "not a dict",
    }
    [stuck] = stuck_collectives(records, world_size=4)
    assert (
        stuck["entered"] == [0] and stuck["never_entered"] == [1, 2] and stuck["no_record"] == [3]
    )


def test_nothing_pending_says_the_hang_is_outside_collectives():
    records = {0: _record({0: (5, 5)}, []), 1: None}
    assert stuck_collectives(records, world_size=2) == []
    assert none_stuck(records, {0: "a", 1: "b"}) == (
        "no collective pending on the 1 rank(s) with a Flight Recorder record: the hang is"
        " outside collectives (see the stacks); no record from rank 1 (b)"
    )
    assert "no Flight Recorder record from any rank" in none_stuck({0: None}, {0: "a"})


def test_a_silent_rank_may_be_in_another_group_so_it_is_not_counted_as_having_entered():
    """DeepSpeed's data-parallel group (pg 1, no name) as a SIGSTOPped rank 1 leaves it: rank 0
    alone says it is in the group; rank 1 is named as giving no record, not left out."""
    records = {0: _record({0: (3, 3), 1: (55, 54)}, [_entry(55, pg=1, name="undefined")]),
               1: None}  # fmt: skip
    [stuck] = stuck_collectives(records, world_size=2)
    assert (stuck["process_group"], stuck["pg_name"]) == ("1", None)
    assert (stuck["entered"], stuck["never_entered"], stuck["no_record"]) == ([0], [], [1])
    assert "every rank entered it" not in describe(stuck, {0: "a", 1: "b"})


def test_the_first_collective_of_a_run_is_found_when_none_completed():
    """torch says -1 completed before any collective ended, and a rank that never enqueued one
    has no status for the group (both as gloo wrote them for a barrier rank 1 never entered)."""
    records = {
        0: _record({0: (1, -1)}, [_entry(1, op="barrier", sizes=())]),
        1: {"rank": 1, "pg_status": {}, "entries": []},
    }
    [stuck] = stuck_collectives(records, world_size=2)
    assert (stuck["seq"], stuck["op"], stuck["input_sizes"]) == (1, "barrier", [])
    assert (stuck["entered"], stuck["never_entered"]) == ([0], [1])
