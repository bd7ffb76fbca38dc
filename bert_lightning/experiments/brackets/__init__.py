"""The brackets sanity suite: the toy corpus and grammar-task generator (`data`) and the
report that trains the variants and compares them with the published numbers (`report`)."""
