mod executors;
