"""The report job: counts + candidates → decoded table, summary, plot and privacy statement."""
