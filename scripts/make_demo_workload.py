"""Write gpucache/data/demo_workload.jsonl, the traffic `gpucache demo` replays.

Prompts written for the project: each topic has a question, rewordings of it (a cache should
serve these) and near-misses (a different question in almost the same words: a cache must
not serve these). Unrelated one-off prompts and exact repeats fill out the stream, the way real
traffic looks. The order is a seeded shuffle, so the file is the same on every run.

    python scripts/make_demo_workload.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS: list[tuple[str, list[str], list[str]]] = [
    (
        "How do I reset my password?",
        [
            "How can I reset my password?",
            "I forgot my password, how do I reset it?",
            "What are the steps to reset my password?",
        ],
        ["How do I reset my username?", "How do I change my email address?"],
    ),
    (
        "Convert 10 miles to km",
        ["How many km is 10 miles?", "10 miles in kilometers"],
        ["Convert 10 km to miles", "Convert 20 miles to km"],
    ),
    (
        "What is the capital of France?",
        ["What's the capital city of France?", "Which city is the capital of France?"],
        ["What is the capital of Germany?", "What is the population of France?"],
    ),
    (
        "How do I cancel my subscription?",
        ["How can I cancel my subscription?", "What's the way to cancel my subscription?"],
        ["How do I pause my subscription?", "How do I renew my subscription?"],
    ),
    (
        "What is the time complexity of binary search?",
        ["What's the big-O of binary search?", "Time complexity of binary search?"],
        ["What is the time complexity of linear search?", "What is the space complexity of binary search?"],
    ),
    (
        "How do I reverse a list in Python?",
        ["How can I reverse a Python list?", "Reverse a list in Python"],
        ["How do I sort a list in Python?", "How do I reverse a string in Python?"],
    ),
    (
        "Translate 'good morning' into Spanish",
        ["How do you say 'good morning' in Spanish?", "What is 'good morning' in Spanish?"],
        ["Translate 'good morning' into French", "Translate 'good night' into Spanish"],
    ),
    (
        "What are the symptoms of the flu?",
        ["What symptoms does the flu cause?", "What are common flu symptoms?"],
        ["What are the symptoms of a cold?", "How is the flu treated?"],
    ),
    (
        "How long should I boil an egg for a soft yolk?",
        ["How many minutes to boil an egg with a soft yolk?", "Boiling time for a soft-boiled egg?"],
        ["How long should I boil an egg for a hard yolk?", "How long should I fry an egg?"],
    ),
    (
        "Flights from London to Paris",
        ["Find flights from London to Paris", "Show me flights from London to Paris"],
        ["Flights from Paris to London", "Trains from London to Paris"],
    ),
    (
        "How do I turn on dark mode?",
        ["How can I enable dark mode?", "Where do I switch on dark mode?"],
        ["How do I turn off dark mode?", "How do I turn on notifications?"],
    ),
    (
        "What is the difference between TCP and UDP?",
        ["How does TCP differ from UDP?", "TCP vs UDP: what's the difference?"],
        ["What is the difference between HTTP and HTTPS?", "Is TCP faster than UDP?"],
    ),
    (
        "Explain what a mutex is",
        ["What is a mutex?", "Can you explain mutexes?"],
        ["Explain what a semaphore is", "Explain what a deadlock is"],
    ),
    (
        "How much is 100 USD in EUR?",
        ["Convert 100 USD to EUR", "What is 100 US dollars in euros?"],
        ["How much is 100 EUR in USD?", "How much is 500 USD in EUR?"],
    ),
    (
        "What time does the store open on Sunday?",
        ["When does the store open on Sundays?", "Sunday opening time of the store?"],
        ["What time does the store close on Sunday?", "What time does the store open on Saturday?"],
    ),
    (
        "How do I merge two dictionaries in Python?",
        ["How can I combine two dicts in Python?", "Merge two Python dictionaries"],
        ["How do I merge two lists in Python?", "How do I compare two dictionaries in Python?"],
    ),
    (
        "Write a haiku about autumn",
        ["Compose a haiku about autumn", "Can you write an autumn haiku?"],
        ["Write a haiku about spring", "Write a limerick about autumn"],
    ),
    (
        "What is the boiling point of water at sea level?",
        ["At what temperature does water boil at sea level?", "Boiling point of water at sea level?"],
        [
            "What is the freezing point of water at sea level?",
            "What is the boiling point of water on Everest?",
        ],
    ),
    (
        "How do I add a user to a group in Linux?",
        ["How can I add a Linux user to a group?", "Add user to group on Linux"],
        ["How do I remove a user from a group in Linux?", "How do I create a group in Linux?"],
    ),
    (
        "Is it safe to take ibuprofen with food?",
        ["Can I take ibuprofen with food?", "Should ibuprofen be taken with food?"],
        ["Is it safe to take ibuprofen with alcohol?", "Is it safe to take aspirin with food?"],
    ),
    (
        "What does HTTP status 404 mean?",
        ["What is an HTTP 404 error?", "Meaning of HTTP status code 404"],
        ["What does HTTP status 500 mean?", "What does HTTP status 403 mean?"],
    ),
    (
        "How do I center a div in CSS?",
        ["How can I center a div with CSS?", "Center a div using CSS"],
        ["How do I hide a div in CSS?", "How do I center text in CSS?"],
    ),
    (
        "Who wrote Pride and Prejudice?",
        ["Who is the author of Pride and Prejudice?", "Pride and Prejudice was written by whom?"],
        ["Who wrote Sense and Sensibility?", "When was Pride and Prejudice published?"],
    ),
    (
        "How do I upgrade pip?",
        ["How can I update pip to the latest version?", "Upgrade pip to the newest version"],
        ["How do I downgrade pip?", "How do I upgrade npm?"],
    ),
    (
        "Set an alarm for 7 am",
        ["Please set an alarm for 7 am", "Wake me up at 7 am"],
        ["Set an alarm for 7 pm", "Set an alarm for 8 am"],
    ),
    (
        "What is the refund policy for damaged items?",
        ["How do refunds work for damaged items?", "Can I get a refund for a damaged item?"],
        ["What is the refund policy for unwanted items?", "What is the exchange policy for damaged items?"],
    ),
    (
        "How do I check my account balance?",
        ["How can I see my account balance?", "Where do I check my balance?"],
        ["How do I check my credit score?", "How do I top up my account balance?"],
    ),
    (
        "Explain gradient descent in simple terms",
        ["What is gradient descent, simply explained?", "Explain gradient descent simply"],
        ["Explain stochastic gradient descent in simple terms", "Explain backpropagation in simple terms"],
    ),
    (
        "How many ounces are in a pound?",
        ["How many oz in a pound?", "Number of ounces in one pound?"],
        ["How many pounds are in a kilogram?", "How many grams are in an ounce?"],
    ),
    (
        "How do I undo the last git commit?",
        ["How can I undo my last commit in git?", "Revert the most recent git commit"],
        ["How do I undo the last git push?", "How do I amend the last git commit?"],
    ),
    (
        "What is the weather like in Tokyo in April?",
        ["How is Tokyo's weather in April?", "Tokyo weather in April?"],
        ["What is the weather like in Tokyo in August?", "What is the weather like in Osaka in April?"],
    ),
    (
        "How do I block a phone number on iPhone?",
        ["How can I block a number on my iPhone?", "Block a caller on iPhone"],
        ["How do I unblock a phone number on iPhone?", "How do I block a phone number on Android?"],
    ),
    (
        "What is a Roth IRA?",
        ["Can you explain what a Roth IRA is?", "Explain Roth IRAs"],
        ["What is a traditional IRA?", "What is a 401k?"],
    ),
    (
        "Summarize the plot of Hamlet",
        ["Give me a summary of Hamlet's plot", "What happens in Hamlet?"],
        ["Summarize the plot of Macbeth", "Who are the main characters in Hamlet?"],
    ),
    (
        "How do I read a CSV file with pandas?",
        ["How can I load a CSV into pandas?", "Read CSV in pandas"],
        ["How do I write a CSV file with pandas?", "How do I read an Excel file with pandas?"],
    ),
]

UNRELATED = [
    "Suggest a name for a golden retriever puppy",
    "What rhymes with orange?",
    "Draft a polite email declining a meeting invitation",
    "List three fun facts about octopuses",
    "What is the tallest mountain in Africa?",
    "Give me a recipe for banana bread",
    "How far is the Moon from Earth?",
    "What is the plural of cactus?",
    "Recommend a science fiction novel for a beginner",
    "Why is the sky blue?",
    "Write a SQL query that counts rows per customer",
    "What year did the Berlin Wall fall?",
    "How do I make cold brew coffee?",
    "What is the square root of 144?",
    "Give me a packing list for a weekend camping trip",
    "What does the acronym NASA stand for?",
    "How do I remove a red wine stain from carpet?",
    "Name the planets in order from the Sun",
    "What is the difference between affect and effect?",
    "Explain the rules of chess castling",
    "How many players are on a soccer team?",
    "What is a good stretch for lower back pain?",
    "Write a regex that matches an IPv4 address",
    "What language is spoken in Brazil?",
    "How do I tie a bowline knot?",
]


def build(seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for group, (base, paraphrases, near_misses) in enumerate(TOPICS):
        rows.append({"prompt": base, "kind": "original", "group": group})
        rows += [{"prompt": base, "kind": "repeat", "group": group} for _ in range(2)]
        rows += [{"prompt": p, "kind": "paraphrase", "group": group} for p in paraphrases]
        rows += [{"prompt": p, "kind": "near-miss", "group": group} for p in near_misses]
    rows += [{"prompt": p, "kind": "unrelated", "group": -1} for p in UNRELATED]
    # originals first within their topic, the rest shuffled: traffic asks a question before
    # it is asked again in other words
    rng.shuffle(rows)
    seen: set[int] = set()
    ordered: list[dict[str, object]] = []
    for row in rows:
        group = int(row["group"])  # type: ignore[call-overload]
        if group >= 0 and group not in seen:
            seen.add(group)
            original = {"prompt": TOPICS[group][0], "kind": "original", "group": group}
            ordered.append(original)
            if row["kind"] == "original":
                continue
        if row["kind"] == "original":
            row = {**row, "kind": "repeat"}
        ordered.append(row)
    return ordered


if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "gpucache" / "data" / "demo_workload.jsonl"
    rows = build()
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} prompts to {out}")
