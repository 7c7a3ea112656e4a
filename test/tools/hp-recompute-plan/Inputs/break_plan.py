"""Writes copies of a plan JSON (argv[1]) into folder argv[2], each with one planted bug (verify.test)."""

import copy
import json
import sys

plan = json.load(open(sys.argv[1]))


def first(actions, pred):
    return next(i for i, a in enumerate(actions) if pred(a))


def renumber(actions, index, step):
    """Shifts the posts and waits indices at or past ``index`` by ``step``: an action was inserted (1) or deleted
    (-1)."""
    for a in actions:
        for key in ("posts", "waits"):
            if key in a:
                a[key] = [i + step if i >= index else i for i in a[key]]


def self_posting(actions):
    """The receives that post only themselves, by index."""
    return [i for i, a in enumerate(actions) if a.get("posts") == [i]]


def no_reduce(p):
    actions = p["ranks"][0]["actions"]
    i = first(actions, lambda a: a["op"] == "reduce_grad" and a["stage"] == 0)
    del actions[i]
    renumber(actions, i, -1)


def posted_twice(p):
    actions = p["ranks"][1]["actions"]
    i, j = self_posting(actions)[:2]
    actions[j]["posts"].append(i)


def posted_out_of_order(p):
    actions = p["ranks"][1]["actions"]
    i, j = self_posting(actions)[:2]
    actions[i]["posts"], actions[j]["posts"] = [j, i], []


def never_posted(p):
    actions = p["ranks"][1]["actions"]
    del actions[self_posting(actions)[0]]["posts"]


def reduce_early(p):
    """Moves stage 0's REDUCE_GRAD to action 3 (posts follow the actions they name)."""
    actions = p["ranks"][0]["actions"]
    i = first(actions, lambda a: a["op"] == "reduce_grad" and a["stage"] == 0)
    del actions[i]
    renumber(actions, i, -1)
    renumber(actions, 3, 1)
    actions.insert(3, {"op": "reduce_grad", "stage": 0})


def reduce_twice(p):
    p["ranks"][0]["actions"] += [{"op": "reduce_grad", "stage": 0}, {"op": "reduce_grad", "stage": 0}]


def duplicate_tag(p):
    sends = [a for a in p["ranks"][0]["actions"] if a["op"] == "send_f"]
    sends[1]["tag"] = sends[0]["tag"]


def send_early(p):
    actions = p["ranks"][0]["actions"]
    actions.insert(0, actions.pop(first(actions, lambda a: a["op"] == "send_f")))


def retain(p):
    actions = p["ranks"][0]["actions"]
    actions[first(actions, lambda a: a.get("retain_on_unpack") is True)]["retain_on_unpack"] = False


def frees(p):
    actions = p["ranks"][0]["actions"]
    actions[first(actions, lambda a: a["op"] == "backward_input")]["frees_graph"] = True


def last_backwards(actions, stage):
    return [i for i, a in enumerate(actions) if a["op"] in ("backward_weight", "backward") and a["stage"] == stage]


def no_last_backward(p):
    actions = p["ranks"][0]["actions"]
    del actions[last_backwards(actions, 0)[-1]]["last_backward"]


def last_backward_early(p):
    """Stage 0's first W says it is the last."""
    actions = p["ranks"][0]["actions"]
    actions[last_backwards(actions, 0)[0]]["last_backward"] = True


def readers(actions):
    return [i for i, a in enumerate(actions) if "waits" in a]


def no_waits(p):
    actions = p["ranks"][1]["actions"]
    del actions[readers(actions)[0]]["waits"]


def waits_swapped(p):
    """Rank 1's first two readers wait for each other's receive."""
    actions = p["ranks"][1]["actions"]
    i, j = readers(actions)[:2]
    actions[i]["waits"], actions[j]["waits"] = actions[j]["waits"], actions[i]["waits"]


def no_hands_to(p):
    actions = p["ranks"][1]["actions"]
    del actions[first(actions, lambda a: "hands_to" in a)]["hands_to"]


def hands_to_other_rank(p):
    """Stage 0's first forward hands to stage 1, which runs on rank 1."""
    actions = p["ranks"][0]["actions"]
    actions[first(actions, lambda a: a["op"] == "forward" and a["stage"] == 0)]["hands_to"] = 1


def hands_to_wrong_stage(p):
    actions = p["ranks"][1]["actions"]
    a = actions[first(actions, lambda a: "hands_to" in a)]
    a["hands_to"] = a["stage"]


for edit in (reduce_early, reduce_twice, duplicate_tag, send_early, retain, frees, no_reduce, posted_twice,
             posted_out_of_order, never_posted, no_last_backward, last_backward_early, no_waits, waits_swapped,
             no_hands_to, hands_to_other_rank, hands_to_wrong_stage):
    broken = copy.deepcopy(plan)
    edit(broken)
    with open(f"{sys.argv[2]}/{edit.__name__.replace('_', '-')}.json", "w") as out:
        json.dump(broken, out)
