"""What may be stored (``CachePolicy``, from content) and what is worth storing
(``AdmissionPolicy``, from traffic). Pure Python, no torch; policies never touch tensors."""
