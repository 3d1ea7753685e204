"""nbgrader configuration of transformer-lab (read by nbgrader and by ``transformer-lab labs``).

The repository itself is the nbgrader course directory for authoring: ``solutions/`` holds the
source notebooks (with solutions, hidden tests and rubrics) and ``labs/`` the generated release.
``transformer-lab labs grade --course DIR`` reuses these settings with ``DIR`` as the root, the
repository's ``solutions/`` as the source and ``DIR/release`` as the release.
"""

c = get_config()  # noqa: F821 (injected by traitlets when nbgrader loads this file)

c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"

# Every cell of a submission may run this many seconds; a hanging cell is interrupted, marked
# as failed, and the rest of the notebook is still executed and graded.
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True
# Test cells deleted from a submission are put back (from the gradebook's stored sources);
# edited ones are restored because they are locked (nbgrader compares checksums).
c.OverwriteCells.add_missing_cells = True

# Students see this where a solution was removed.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# --- The kit's own course settings (read by `transformer-lab labs`; nbgrader ignores them) ---
# Where the notebooks' setup cells install the kit from on Colab or a laptop: the folder where the
# course publishes what `transformer-lab labs build` writes to dist/student/ (the wheel and
# latest.json, which names the current build; docs/grading.md, "Publishing what students
# install"). `labs build` writes it into every lab; a setup cell upgrades an older kit.
c.TransformerLab.kit_source = "https://YOUR-COURSE-SITE/kit/"
# Each lab's deadline ("2026-10-02" = the end of that day, UTC; or "2026-10-02T17:00+01:00").
# The student package holds the kit's own answers of a lab only once its deadline has passed:
# rebuild and republish it after each deadline. A lab without a deadline stays locked.
c.TransformerLab.deadlines = {}
