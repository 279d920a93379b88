"""gputop.ui: the Textual app (``gputop.ui.app.GputopApp`` / ``run_app``) and its panels.

See gputop/ui/README.md: how a tick works, the views and keys, and how to add a panel.
"""
