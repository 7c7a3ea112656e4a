"""Writes copies of a plan JSON (argv[1]) into folder argv[2], each with one planted bug (verify.test)."""

import copy
import json
import sys

plan = json.load(open(sys.argv[1]))


def first(actions, pred):
    return next(i for i, a in enumerate(actions) if pred(a))


def reduce_early(p):
    p["ranks"][0]["actions"].insert(3, {"op": "reduce_grad", "stage": 0})


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


for edit in (reduce_early, reduce_twice, duplicate_tag, send_early, retain, frees):
    broken = copy.deepcopy(plan)
    edit(broken)
    with open(f"{sys.argv[2]}/{edit.__name__.replace('_', '-')}.json", "w") as out:
        json.dump(broken, out)
