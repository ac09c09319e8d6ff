mod verify;
