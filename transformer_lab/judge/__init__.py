"""The kernel's side of the judge: answer the grader's requests with plain data, nothing else.

While a submission is graded, every autograded point is decided by the grader's *judge*
(:mod:`transformer_lab.grading.judge`), a process the student's code cannot reach. The judge
asks the student's kernel to look up a name, call a function, build an object or read an
attribute, and receives the results as data (:mod:`transformer_lab.judge.wire`: JSON with
tensors in safetensors). It compares them with its own oracles on its own side. The kernel never
sees an expected value, a tolerance or a verdict, so nothing running in it can forge one: code
that rewrites this package can only return other data, which is judged like any answer.

This package holds no answer and no check; it is in the student package too (harmless there).
Reference: the checker design of programming-contest judges (DMOJ, Kattis problemtools).
"""
