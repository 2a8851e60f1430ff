"""Long campaigns: the supervisor that starts, resumes and reports on lanes, and the lane process each one runs."""
