"""The pair model: a cross-encoder that reads two prompts together and scores whether one's answer
serves the other (model.py), and how the project trains it (training/)."""
