"""Training: the jitted step (`step`), the loop behind ``--mode=train`` (`loop`), the device mesh
and sharding (`sharding`), and metrics (`metrics`)."""
