cuda = "13.0"
hip = None
