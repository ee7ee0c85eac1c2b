"""What the collection learns from its visitors: kept photos (opt-in, re-encoded, with a quota and a
retention period), anonymous counts per hour of what visitors ask about, and the staff's review
queue that turns a kept photo into a new reference view or a real unknown view.

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

__all__: list[str] = []
