"""The brackets sanity suite: the report that trains the variants on the toy corpus and
grammar task (`bert_lightning/data/brackets.py`) and compares them with the published numbers."""
