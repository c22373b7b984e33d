"""Push delivery to the application: subscriptions, their runners, and what answers mean."""
