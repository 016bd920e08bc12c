"""Built-in prompts for the demo and for measuring (`generate --example NAME`).

Copy-heavy ones (where prompt lookup drafts well), an open chat one (where it cannot), and two JSON ones
for --json-schema examples/person.schema.json: an extraction (the answer rewords the prompt) and a copy."""

EXAMPLES = {
    "copy": (
        "Repeat the following text exactly, word for word, and do not add anything:\n\n"
        "The quick brown fox jumps over the lazy dog. The lazy dog does not move, because the lazy dog "
        "is sleeping in the warm afternoon sun. The quick brown fox jumps over the lazy dog again, and "
        "then the quick brown fox runs into the forest to find its family."
    ),
    "code": (
        "Rename the function `add` to `sum_two` in this Python code and show the full code:\n\n"
        "```python\n"
        "def add(a, b):\n"
        '    """Return the sum of a and b."""\n'
        "    return a + b\n\n\n"
        "def add_all(numbers):\n"
        "    total = 0\n"
        "    for number in numbers:\n"
        "        total = add(total, number)\n"
        "    return total\n\n\n"
        "print(add(2, 3))\n"
        "print(add_all([1, 2, 3, 4]))\n"
        "```"
    ),
    "chat": "Give me three tips for learning to play the guitar.",
    "json": (
        "Extract the person described below as a JSON object with the fields name, age, city and hobbies "
        "(a list of strings). Answer with the JSON object only.\n\n"
        "Maria Lopez is 34 years old and lives in Valencia. In her free time she enjoys rock climbing, "
        "baking bread and playing the violin."
    ),
    "json-copy": (
        "Repeat the following JSON object exactly, and do not add anything:\n\n"
        '{"name": "Maria Lopez", "age": 34, "city": "Valencia", '
        '"hobbies": ["rock climbing", "baking bread", "playing the violin"]}'
    ),
}
