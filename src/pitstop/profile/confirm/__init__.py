"""Predictions timed again in fresh runs of the script (malloc thresholds, DataLoader workers), within the
time budget the profile's answer allows, and the verdicts of earlier ``pitstop fix`` runs."""
