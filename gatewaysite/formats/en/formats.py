"""How the admin writes dates and times (issue 47 point 7): one format everywhere, lists and pages alike,
to the second and naming its zone (the gateway's TIME_ZONE is UTC): `2026-12-05 05:30:07 UTC`. Django's
English default ("Dec. 5, 2026, 5:25 a.m.") had neither seconds nor zone, and the lists differed from the
pages. Installed by FORMAT_MODULE_PATH; what a form accepts is Django's English input formats, whose
first (`2026-12-05 05:30:07`) is also how a form shows a value."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = DATETIME_FORMAT
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = DATE_FORMAT
TIME_FORMAT = "H:i:s"
