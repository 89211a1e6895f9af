"""Example apps shipped with coldbrew (the demo uses ``coldbrew.examples.demo:app``)."""
