"""LexicalNearMissVerifier (gpucache/guard/lexical.py): the founding rules and the additions, one
table of hand-written cases, determinism."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucache import LexicalNearMissVerifier, Verdict
from gpucache.guard.lexical import ADDED_RULES, NAMED_KINDS, RULES, SEED_RULES

V = LexicalNearMissVerifier()

# A question of about forty words, for the long-prompt cases of the added rule.
LONG_QUESTION = (
    "Our payment service started timing out every night around two in the morning after we "
    "moved the database to a larger instance, and the connection pool keeps growing until the "
    "pods restart, even though traffic at that hour is low. What is the most likely cause?"
)

# (cached prompt, new prompt, the rule that must reject it)
MUST_REJECT = [
    # the founding rules' own examples
    ("convert 10 miles to km", "convert 10 km to miles", "direction"),
    ("reset my password", "reset my username", "substitution"),
    ("What is 5 + 5?", "What is 50 + 5?", "numbers"),
    ("I have two cats", "I have four cats", "numbers"),
    ("flights to London", "flights from London", "polarity"),
    ("turn the lights on", "turn the lights off", "polarity"),
    ("coffee with sugar", "coffee without sugar", "polarity"),
    ("Can I get a virtual card?", "Can I get a non virtual card?", "negation"),
    # numbers: digits, words, decimals, groupings, versions, ordinals, dates, times, money
    ("Convert 10 miles to km", "Convert 20 miles to km", "numbers"),
    ("How much is 100 USD in EUR?", "How much is 500 USD in EUR?", "numbers"),
    ("Set an alarm for 7 am", "Set an alarm for 8 am", "numbers"),
    ("What happened on July 4 1776?", "What happened on July 4 1777?", "numbers"),
    ("Is 3.5 bigger than 3.15?", "Is 3.5 bigger than 3.25?", "numbers"),
    ("Install Python 3.11", "Install Python 3.12", "numbers"),
    ("How do I migrate from python2 to python3?", "How do I migrate from python3 to python4?", "numbers"),
    ("What was the GDP of France in 2019?", "What was the GDP of France in 2020?", "numbers"),
    ("Sort an array of 1,000 items", "Sort an array of 10,000 items", "numbers"),
    ("Who won the first world war?", "Who won the second world war?", "numbers"),
    ("Explain the 2nd amendment", "Explain the 1st amendment", "numbers"),
    ("Book a table for two people", "Book a table for three people", "numbers"),
    ("What is 15% of 200?", "What is 20% of 200?", "numbers"),
    ("Meeting at 10:30 tomorrow", "Meeting at 11:30 tomorrow", "numbers"),
    ("Give me a 5 day itinerary for Rome", "Give me a 7 day itinerary for Rome", "numbers"),
    ("Use HTTP/2 for the API", "Use HTTP/3 for the API", "numbers"),
    (
        "Write a function that returns the 10th Fibonacci number",
        "Write a function that returns the 20th Fibonacci number",
        "numbers",
    ),
    ("Print numbers 1 to 10 in Python", "Print numbers 1 to 100 in Python", "numbers"),
    # negation
    ("Why does my phone charge?", "Why doesn't my phone charge?", "negation"),
    ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?", "negation"),
    ("My card was charged", "My card was never charged", "negation"),
    ("I can log in to my account", "I cannot log in to my account", "negation"),
    ("The payment went through", "The payment did not go through", "negation"),
    ("Do n't use global variables", "Use global variables", "negation"),
    ("Which foods contain gluten?", "Which foods contain no gluten?", "negation"),
    # polarity with the same content words
    ("Flights from London to Paris", "Flights to London from Paris", "direction"),
    ("Transfer money to savings", "Transfer money from savings", "polarity"),
    ("How do I turn on dark mode?", "How do I turn off dark mode?", "antonym"),  # enable / disable
    ("switch on autocorrect on an iPad", "deactivate autocorrect on an iPad", "antonym"),
    ("Pizza with mushrooms", "Pizza without mushrooms", "polarity"),
    ("What happens before the exam?", "What happens after the exam?", "polarity"),
    ("Scroll up the page", "Scroll down the page", "polarity"),
    ("Log in", "Log out", "polarity"),
    ("Is the temperature above zero?", "Is the temperature below zero?", "polarity"),
    ("Are there more cats than dogs?", "Are there fewer cats than dogs?", "polarity"),
    # antonyms (an addition to the founding rules)
    ("How do I enable two factor authentication?", "How can I disable two factor authentication?", "antonym"),
    ("How do I add a user to a group in Linux?", "How can I remove a user from a Linux group?", "antonym"),
    ("Best time to buy a car", "Best time to sell a car", "antonym"),
    ("What is the minimum wage in Spain?", "What is the maximum wage in Spain?", "antonym"),
    ("How to upload files to S3", "How to download files from S3", "antonym"),
    ("How do I encrypt a file with gpg?", "How do I decrypt a file with gpg?", "antonym"),
    ("Export contacts from Outlook", "Import contacts into Outlook", "antonym"),
    ("Sort the list in ascending order", "Sort the list in descending order", "antonym"),
    ("How do I lock my screen on Windows?", "How do I unlock my screen on Windows?", "antonym"),
    ("What are the advantages of remote work?", "What are the disadvantages of remote work?", "antonym"),
    ("How do I deposit a cheque?", "How do I withdraw a cheque?", "antonym"),
    ("Set an alarm for 7 am", "Set an alarm for 7 pm", "antonym"),
    ("Convert Kelvin to Rankine", "Convert Rankine to Kelvin", "direction"),
    ("How do I follow someone on Twitter?", "How do I unfollow someone on Twitter?", "antonym"),
    ("Why is my upload speed slow?", "Why is my download speed slow?", "antonym"),
    # reordered around a directional word
    (
        "Render this paragraph from Markdown to HTML",
        "Render this paragraph from HTML to Markdown",
        "direction",
    ),
    ("Is Python faster than Java?", "Is Java faster than Python?", "direction"),
    ("How many cups in a liter?", "How many liters in a cup?", "direction"),
    ("Exchange rate from USD to JPY", "Exchange rate from JPY to USD", "direction"),
    ("Distance from Berlin to Munich by train", "Distance from Munich to Berlin by train", "direction"),
    ("Merge branch main into feature", "Merge branch feature into main", "direction"),
    ("Is Messi better than Ronaldo?", "Is Ronaldo better than Messi?", "direction"),
    ("Copy files from the server to my laptop", "Copy files from my laptop to the server", "direction"),
    # two words traded places (an addition to the founding rules)
    ("Alice sent Bob the report", "Bob sent Alice the report", "swapped"),
    (
        "The film was directed by Smith and produced by Jones",
        "The film was produced by Smith and directed by Jones",
        "swapped",
    ),
    ("dog bites man", "man bites dog", "swapped"),
    # a different wh-thing asked (an addition to the founding rules)
    ("Who wrote Pride and Prejudice?", "When was Pride and Prejudice published?", "question-word"),
    # named differences of the redesign: one example row each here, more in test_differences.py
    (
        "Is there a dessert near Tucson worth trying?",
        "Is there a desert near Tucson worth visiting?",
        "confusable",
    ),
    ("Did the Romans conquer the Gauls?", "Were the Romans conquered by the Gauls?", "voice"),
    ("Which phones launched last spring?", "Which phones launched this spring?", "time"),
    ("List 12 percent of 80 as a decimal", "List what percent of 80 is 12 as a decimal", "relation"),
    ("filter orders where paid and shipped", "filter orders where paid or shipped", "relation"),
    (
        "the tall engineer met the young pilot and the old doctor at the station near the harbour",
        "the young engineer met the old pilot and the tall doctor at the station near the harbour",
        "reordered",
    ),
    ("Where is the Eiffel Tower?", "Why is the Eiffel Tower famous?", "question-word"),
    ("When does the store open?", "Where does the store open?", "question-word"),
    # shared words cross a directional word while the rest differs (an addition to the founding rules)
    ("How much is 100 EUR in USD?", "Convert 100 USD to EUR", "crossed"),
    ("How long does it take to drive from Boston to New York?", "Driving time New York to Boston", "crossed"),
    # most words shared, some moved (an addition to the founding rules)
    (
        "In 2018 the Utah House of Representatives passed a bill to legalize the right to grow and try medical marijuana plants",
        "In 2018 the House of Representatives of Utah passed a bill to grow the right to try and marijuana plants",
        "roles",
    ),
    (
        "The Villa Pesquera facilities are owned by the Municipality of Ponce but operated by the fishermen themselves",
        "The facilities of Villa Pesquera are operated by the Municipality of Ponce but are owned by the fishermen",
        "roles",
    ),
    # substitutions
    ("How do I reset my password?", "How do I reset my username?", "substitution"),
    ("What is the capital of France?", "What is the capital of Germany?", "entity"),
    ("How do I reverse a list in Python?", "How do I sort a list in Python?", "substitution"),
    ("How do I reverse a list in Python?", "How do I reverse a string in Python?", "substitution"),
    ("Translate 'good morning' into Spanish", "Translate 'good morning' into French", "entity"),
    ("Translate 'good morning' into Spanish", "Translate 'good night' into Spanish", "payload"),
    # symbols and operators are content
    ("Is y > 10 here?", "Is y < 10 here?", "symbols"),
    ("what does a && b return", "what does a || b return", "symbols"),
    ("Compute 7 - 3 for me", "Compute 7 + 3 for me", "symbols"),
    ("Why is `i += 1` slow here?", "Why is `i -= 1` slow here?", "symbols"),
    # a payload is compared whole, apart from the instruction around it
    (
        "Shorten: 'We will ship the order on Friday.'",
        "Shorten: 'We will ship the order on Sunday.'",
        "payload",
    ),
    ("What does `ls -a` print?", "What does `ls -l` print?", "payload"),
    ('Proofread "Its a nice day"', 'Proofread "Its a rainy day"', "payload"),
    # the same payload under a different instruction is still a different request
    (
        "Count the words in this sentence: 'red fish, blue fish'",
        "Count the letters in this sentence: 'red fish, blue fish'",
        "deliverable",
    ),
    ("Translate into German: 'see you soon'", "Translate into Italian: 'see you soon'", "entity"),
    # a number scaled by a word is one number
    ("Plan a trip budget of ten dollars", "Plan a trip budget of ten thousand dollars", "numbers"),
    ("Plan a trip budget of 10k dollars", "Plan a trip budget of 10 dollars", "numbers"),
    # who wrote it, or what it is about
    ("Find essays by George Orwell", "Find essays about George Orwell", "polarity"),
    ("What are the symptoms of the flu?", "What are the symptoms of a cold?", "substitution"),
    ("What does HTTP status 404 mean?", "What does HTTP status 500 mean?", "numbers"),
    ("How do I center a div in CSS?", "How do I hide a div in CSS?", "substitution"),
    ("Who wrote Pride and Prejudice?", "Who wrote Sense and Sensibility?", "entity"),
    ("How do I upgrade pip?", "How do I upgrade npm?", "substitution"),
    (
        "What is the time complexity of binary search?",
        "What is the time complexity of linear search?",
        "substitution",
    ),
    (
        "What is the difference between TCP and UDP?",
        "What is the difference between HTTP and HTTPS?",
        "substitution",
    ),
    ("Explain what a mutex is", "Explain what a semaphore is", "substitution"),
    ("How do I read a CSV file with pandas?", "How do I read an Excel file with pandas?", "entity"),
    ("What is the weather in Tokyo in April?", "What is the weather in Osaka in April?", "entity"),
    ("Call torch.matmul on two tensors", "Call torch.bmm on two tensors", "substitution"),
    ("How do I use numpy.argmax?", "How do I use numpy.argmin?", "substitution"),
    ("How do I cancel my order?", "How do I track my order?", "substitution"),
    ("What is the price of gold today?", "What is the price of silver today?", "substitution"),
    ("Rent an apartment in Madrid", "Buy an apartment in Madrid", "substitution"),
    ("How do I say thank you in Japanese?", "How do I say thank you in Korean?", "entity"),
    ("Convert 10 euros to dollars", "Convert 10 euros to pounds", "substitution"),
    ("How long to boil an egg for a soft yolk?", "How long to boil an egg for a hard yolk?", "substitution"),
    ("What time does the store open on Sunday?", "What time does the store open on Saturday?", "entity"),
    ("Git undo last commit", "Git amend last commit", "substitution"),
    ("Install docker on Ubuntu", "Install docker on Debian", "entity"),
    # conservative by design (the founding rules): a one-word synonym swap costs a miss, never a wrong answer
    ("How do I cancel my subscription?", "How do I end my subscription?", "substitution"),
    ("How do I merge two dictionaries in Python?", "How can I combine two dicts in Python?", "substitution"),
    # one prompt asks for more: a qualifier, a clause, an instruction (an addition to the founding rules)
    ("How do I bake bread?", "How do I bake bread in a cast iron pot?", "constraint"),
    ("Write a poem about the sea", "Write a poem about the sea for my grandmother's funeral", "audience"),
    ("Explain recursion", "Can you explain recursion to me with an example?", "constraint"),
    ("How do I install Node on Ubuntu?", "How do I install Node on Ubuntu without sudo?", "constraint"),
    ("Translate this paragraph into formal German", "Translate this paragraph into German", "tone"),
    ("Sort a list of numbers in descending order", "Sort a list of numbers", "constraint"),
    ("Give me a packing list for Norway", "Give me a packing list for Norway in winter", "constraint"),
    ("What's a good laptop for students?", "What's a good laptop for students that runs Linux?", "entity"),
    ("Tips for a job interview", "Give me advice and tips for preparing for my job interview", "added"),
    # a shared long question, a different closing instruction
    (
        LONG_QUESTION + " Answer in the form of a checklist for the on-call engineer.",
        LONG_QUESTION + " Focus on what the postmortem should say to customers.",
        "deliverable",
    ),
    (LONG_QUESTION, LONG_QUESTION + " Keep it under a hundred words.", "added"),
    (LONG_QUESTION, LONG_QUESTION + " Include the commands you would run.", "added"),
    # conservative by design: a reworded question that also carries an extra content word
    # costs a miss ("cause", "forgot" are not framing), never a wrong answer
    ("What are the symptoms of the flu?", "What symptoms does the flu cause?", "added"),
    ("How do I reset my password?", "I forgot my password, how do I reset it?", "added"),
    # an exposition verb is framing only where it opens an instruction that answers a question
    ("Translate this email into French", "Translate this email into French and summarize it", "constraint"),
    ("Who was Marie Curie?", "Who was Marie Curie's husband?", "added"),
    ("Tell me about the Roman Empire", "Who founded the Roman Empire?", "added"),
    ("Tell me about Grace Hopper", "When was Grace Hopper born?", "added"),
    ("Write one haiku about 3 cats", "Write 2 haikus about 3 cats", "numbers"),
    # joined by "or"/"and" is no excuse for a subject and object, or for numbers
    ("Does the hawk hunt the rabbit?", "Does the rabbit hunt the hawk?", "swapped"),
    ("Divide 12 and 4", "Divide 4 and 12", "swapped"),
    (
        "Is London or Paris closer to Berlin than Rome?",
        "Is Rome or Paris closer to Berlin than London?",
        "direction",
    ),
    # a name the parser reads as a stopword still trades places ("Go" the language)
    ("Is Go more popular than Rust?", "Is Rust more popular than Go?", "swapped"),
    # politeness is set aside, the request it wraps is not
    ("Help me write a cover letter", "Help me write a cover letter for a nursing job, thanks", "constraint"),
    # a relative "who" is set aside; the clause it opens is not
    ("Write a story about a knight", "Write a story about a knight who fears the dark", "constraint"),
]

# (cached prompt, new prompt): rewordings the verifier must let through to the threshold
MUST_ACCEPT = [
    # verbs of one meaning in any request (interchangeable.txt's synonyms)
    ("How can I remove old kernels from Ubuntu?", "How can I delete old kernels from Ubuntu?"),
    ("switch off autocorrect on an iPad", "disable autocorrect on an iPad"),
    ("Can I modify a signed PDF form?", "Can I edit a signed PDF form?"),
    # a noun naming the kind of thing asked for, which the question implies (lexical.RESTATING)
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("Who was the person who painted the Night Watch?", "Who painted the Night Watch?"),
    # "in simple terms" and "simply explained" ask for the same thing (the earlier guard
    # refused it as an added request)
    ("Explain gradient descent in simple terms", "What is gradient descent, simply explained?"),
    # one payload, the instruction worded two ways; nouns that point at the payload add nothing
    (
        "Summarize: 'The store moves to Elm Street in May.'",
        "Please give me a summary of this text: 'The store moves to Elm Street in May.'",
    ),
    ("Proofread this paragraph: 'I has a apple.'", "Proofread: 'I has a apple.'"),
    # "... or not?" asks what the bare question asks
    (
        "Is this review positive or not? 'Great battery life.'",
        "Is this review positive? 'Great battery life.'",
    ),
    ("Is coffee bad for you or not?", "Is coffee bad for you?"),
    # clauses put in another order, each moved whole
    (
        "For a team that works remote across three time zones, which meeting schedule keeps everyone awake?",
        "Which meeting schedule keeps everyone awake for a team that works remote across three time zones?",
    ),
    # a number written with a scale word or a suffix is the same number
    ("Plan a trip budget of ten thousand dollars", "Plan a trip budget of 10k dollars"),
    ("Write two hundred words on rain", "Write 200 words on rain"),
    # a name said again, or a pronoun for it, adds nothing
    ("Who was Alan Turing and what did Alan Turing build?", "Who was Alan Turing and what did he build?"),
    # a hyphen inside a word, a slash between words, are not operators
    ("Recommend well-known sci-fi novels", "Recommend well known sci fi novels"),
    ("How do I reset my password?", "How do I reset my password?"),
    ("How do I reset my password?", "how do i reset my password"),
    ("How do I reset my password?", "How can I reset my password?"),
    ("How do I reset my password?", "What are the steps to reset my password?"),
    ("Convert 10 miles to km", "How many km is 10 miles?"),
    ("Convert 10 miles to km", "10 miles in kilometers, please"),
    ("Flights from London to Paris", "Flights to Paris from London"),
    ("Flights from London to Paris", "Show me flights from London to Paris"),
    ("How do I cancel my subscription?", "What's the way to cancel my subscription?"),
    ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ("How much is 100 USD in EUR?", "What is 100 US dollars in euros?"),
    ("How much is 100 USD in EUR?", "How much is 100 USD in EUR"),
    ("Set an alarm for 7 am", "Please set an alarm for 7 am"),
    ("What is the boiling point of water at sea level?", "At what temperature does water boil at sea level?"),
    ("Sort an array of 1,000 items", "Sort an array of 1000 items"),
    ("Book a table for two people", "Book a table for 2 people"),
    ("How does one learn Spanish quickly?", "How do I learn Spanish quickly?"),
    ("What is the GDP of France?", "what is the gdp of france ?"),
    ("What is the GDP of France?", "What’s the GDP of France?"),
    ("How do I undo the last git commit?", "How can I undo my last commit in git?"),
    ("Summarize the plot of Hamlet", "Give me a summary of Hamlet's plot"),
    ("What is 3.50 plus 2?", "What is 3.5 plus 2?"),
    ("Recommend a good science fiction novel", "Can you recommend a good science fiction novel?"),
    (
        "In 1965 he moved to Boston to study law at Harvard",
        "He moved to Boston in 1965 to study law at Harvard",
    ),
    ("Flights from London to Paris tomorrow", "Tomorrow's flights to Paris from London"),
    ("How do I block a number on my iPhone?", "How can I block a number on iPhone?"),
    ("How do I learn Python fast?", "What is the fastest way to learn Python?"),
    ("At high altitude, how long should I boil pasta?", "How long should I boil pasta at high altitude?"),
    # framing, politeness and hedges are not an added request
    ("Hi! Can you explain what an index fund is? Thanks!", "What is an index fund?"),
    ("Give me some tips on growing basil", "How do I grow basil?"),
    ("Could you tell me what the steps are to renew a passport?", "How do I renew a passport?"),
    ("Show me how to tie a bowline", "How do I tie a bowline?"),
    ("So what exactly is a hash table, honestly?", "What is a hash table?"),
    ("How can one keep basil alive indoors?", "How do I keep basil alive indoors?"),
    ("Why do people like jazz so much?", "Why do people like jazz?"),
    ("Could you recommend a good thriller?", "What is a good thriller?"),
    ("Can you help me write a cover letter? Thx!", "Write a cover letter"),
    ("Pls summarize this memo, I'd appreciate it", "Summarize this memo"),
    # the table: spelling variants, abbreviations and units, powers, instruction verbs
    ("How do I organise my photos by colour?", "How do I organize my photos by color?"),
    (
        "What does the config file for k8s look like?",
        "What does the configuration file for Kubernetes look like?",
    ),
    ("How many tbsp of sugar are in 100 g?", "How many tablespoons of sugar are in 100 grams?"),
    ("How many ounces are in a pound?", "How many oz in a pound?"),
    ("What is the derivative of x squared?", "What is the derivative of x^2?"),
    ("Plot x**2 from 0 to 5", "Plot x² from 0 to 5"),
    ("Draft a memo about the office move", "Write a memo about the office move"),
    ("Write a haiku about autumn", "Compose a haiku about autumn"),
    ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
    ("Outline the stages of mitosis", "List the stages of mitosis"),
    ("Enumerate the causes of the French Revolution", "List the causes of the French Revolution"),
    (
        "My web page loads slowly. How can I speed it up?",
        "My web page loads slowly. How do I make it faster?",
    ),
    ("How do I accelerate my laptop's boot?", "How do I speed up my laptop's boot?"),
    # a question and an instruction asking for one exposition
    ("Who was Grace Hopper?", "Tell me about Grace Hopper"),
    ("What is the story of Beowulf?", "Summarize the story of Beowulf"),
    ("What is a black hole?", "Describe a black hole"),
    # two words joined by "or"/"and" trade places without changing the question
    ("Should I learn Python or Java first?", "Should I learn Java or Python first?"),
    ("Is a cat or a dog a better pet for a small flat?", "Is a dog or a cat a better pet for a small flat?"),
    ("Whisk the eggs and the milk together", "Whisk the milk and the eggs together"),
    # "one" beside the same numbers is a word, not a count that changed
    ("Suggest one book on Rome written before 1900", "Suggest a book on Rome written before 1900"),
    # weights, speeds, and words that ask for the same thing
    ("Convert 3 pounds to kg", "Convert 3 lbs to kg"),
    ("What is 100 km/h in mph?", "What is 100 kph in mph?"),
    ("Write a brief bio for my website", "Write a short bio for my website"),
    ("What are the advantages of solar panels?", "What are the benefits of solar panels?"),
    ("What are the disadvantages of solar panels?", "What are the downsides of solar panels?"),
    ("How do I get rid of moles in my lawn?", "How do I eliminate moles in my lawn?"),
    ("Generate five slogans for a gym", "Come up with five slogans for a gym"),
    ("Gift ideas for a coworker who likes tea", "Present ideas for a coworker who likes tea"),
    # irregular plurals, a noun beside its verb, a word written apart or joined
    ("How do I sort the indices of an array?", "How do I sort the indexes of an array?"),
    ("What are the criteria for a good hash function?", "What is the criterion for a good hash function?"),
    ("Define entropy", "What is the definition of entropy?"),
    ("How do I build a web site with Django?", "How do I build a website with Django?"),
    ("How do I clean my key board?", "How do I clean my keyboard?"),
    # a relative "who" asks what a relative "that" asks
    ("Write a story about a knight who fears the dark", "Write a story about a knight that fears the dark"),
    ("Tips for travelling in Peru with a toddler", "Tips for traveling in Peru with a toddler"),
    # "A vs B" asks what "the difference between A and B" asks
    ("What is the difference between Redis and Memcached?", "Redis vs Memcached: what's the difference?"),
    # two forms of one word are not a substitution
    ("What is your favorite song?", "What are your favorite songs?"),
    ("What is memory fragmentation?", "What is a memory fragmenter?"),
    ("Tips for dating an Australian", "Tips to date an Australian"),
    # nor are two words of one interchangeable class
    ("What are good opening lines for a speech?", "What are the best opening lines for a speech?"),
    ("Recommend a movie about space", "Recommend a film about space"),
    ("Where can I buy a used car?", "Where can I purchase a used car?"),
]

# The exemptions stay narrow: a shared prefix alone does not make two words one word, and a
# word outside the interchangeable classes still counts as a substitution.
STILL_SUBSTITUTIONS = [
    ("How do I find an internship?", "How do I find an internet?"),
    ("How do I reset my password?", "How do I reset my passport?"),
    ("What is a good laptop?", "What is a cheap laptop?"),
    ("Recommend a movie about space", "Recommend a book about space"),
]

# The table makes words one; what changes the question still rejects under the right rule.
TABLE_STILL_REJECTS = [
    ("What is the derivative of x squared?", "What is the derivative of x cubed?", "numbers"),
    ("Plot x^2 from 0 to 5", "Plot x^3 from 0 to 5", "numbers"),
    ("Convert 5 kg to lb", "Convert 5 lb to kg", "direction"),
    ("Is Redis faster than Memcached?", "Is Memcached faster than Redis?", "direction"),
    ("How do I start the colour printer?", "How do I stop the color printer?", "antonym"),
    ("Write a haiku about autumn", "Summarize a haiku about autumn", "substitution"),
    ("Outline the stages of mitosis", "Outline the stages of meiosis", "substitution"),
    ("How do I make my laptop faster?", "How do I make my laptop quieter?", "substitution"),
    ("How do I sort the indices of an array?", "How do I sort the vertices of a graph?", "substitution"),
    ("Define entropy", "Define enthalpy", "substitution"),
    ("Convert 12 ounces to grams", "Convert 12 g to oz", "direction"),
    ("What are the advantages of solar panels?", "What are the disadvantages of solar panels?", "antonym"),
    ("Write a brief summary of the war", "Write a detailed summary of the war", "substitution"),
    ("How do I get rid of moles in my lawn?", "How do I attract moles to my lawn?", "substitution"),
    # two words spell one only in order and in full
    ("How do I clean my board key?", "How do I clean my keyboard?", "substitution"),
]


@pytest.mark.parametrize("cached, new, rule", MUST_REJECT)
def test_must_reject(cached, new, rule):
    verdict = V.explain(cached, new)
    assert verdict.rejected and verdict.rule == rule, verdict
    assert V.verify(cached, new, 0.99) is False
    assert V.explain(new, cached).rejected  # a near-miss is a near-miss both ways


@pytest.mark.parametrize("cached, new", STILL_SUBSTITUTIONS)
def test_exemptions_from_substitution_stay_narrow(cached, new):
    """Words no table joins stay a difference: the substitution rule, or the rule that names
    their kind ("cheap" is a constraint)."""
    verdict = V.explain(cached, new)
    assert verdict.rejected and verdict.rule in ("substitution", *NAMED_KINDS, "constraint"), verdict


@pytest.mark.parametrize("cached, new, rule", TABLE_STILL_REJECTS)
def test_the_table_joins_words_and_keeps_what_changes_the_question(cached, new, rule):
    verdict = V.explain(cached, new)
    assert verdict.rejected and verdict.rule in (rule, *NAMED_KINDS, "constraint"), verdict


@pytest.mark.parametrize("cached, new", MUST_ACCEPT)
def test_must_accept(cached, new):
    verdict = V.explain(cached, new)
    assert not verdict.rejected, verdict
    assert V.verify(cached, new, 0.9) is True


@pytest.mark.parametrize("cached, new, rule", MUST_REJECT)
def test_each_rule_rejects_its_examples_alone(cached, new, rule):
    """A rule stands on its own: with every other rule switched off it still rejects what it
    is written for (``gpucache calibrate`` switches soft rules off one set at a time, so no
    rule may lean on an earlier one having run)."""
    alone = LexicalNearMissVerifier(skip=set(RULES) - {rule})
    assert alone.explain(cached, new).rule == rule


def test_the_rules_are_the_founding_rules_and_the_named_additions():
    assert set(RULES) == {rule for _, _, rule in MUST_REJECT}
    assert set(SEED_RULES) | set(ADDED_RULES) == set(RULES)
    assert not set(SEED_RULES) & set(ADDED_RULES)


@pytest.mark.parametrize("cached, new, rule", MUST_REJECT)
def test_a_skipped_rule_never_decides(cached, new, rule):
    without = LexicalNearMissVerifier(skip=(rule,))
    verdict = without.explain(cached, new)
    assert verdict.rule != rule  # a later rule may still reject the pair
    assert without.verify(cached, new, 0.99) is (not verdict.rejected)


@pytest.mark.parametrize("cached, new, rule", MUST_REJECT)
def test_with_every_rule_skipped_only_similarity_decides(cached, new, rule):
    verdict = LexicalNearMissVerifier(skip=RULES).explain(cached, new)
    # "identical" where only symbols told them apart: words alone cannot
    assert not verdict.rejected and verdict.rule in ("rewording", "identical", "context")


def test_skipping_a_rule_is_what_serves_its_example():
    """A switched-off rule is a deployment's decision to serve what it would have refused."""
    pair = ("reset my password", "reset my username")
    assert V.explain(*pair).rule == "substitution"
    assert LexicalNearMissVerifier(skip=("substitution",)).explain(*pair) == Verdict(False, "rewording")
    # other rules still run: the miles/km near-miss is then caught by the next rule in line
    miles = ("Convert 10 miles to km", "Convert 10 km to miles")
    assert LexicalNearMissVerifier(skip=("direction",)).explain(*miles).rule == "swapped"


def test_skip_takes_known_rule_names():
    with pytest.raises(ValueError, match=r"unknown rules \['directon'\]"):
        LexicalNearMissVerifier(skip=("directon",))
    with pytest.raises(TypeError, match="not one string"):
        LexicalNearMissVerifier(skip="numbers")
    without = LexicalNearMissVerifier(skip=["reordered", "crossed"])
    assert without.skip == frozenset({"crossed", "reordered"})
    assert without.name == "lexical-near-miss-without-crossed-reordered"  # distinct in metrics
    assert repr(without) == "LexicalNearMissVerifier(skip=('crossed', 'reordered'))"
    assert V.name == "lexical-near-miss" and V.skip == frozenset()


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.sets(st.sampled_from(RULES)))
def test_a_skipped_rule_never_decides_any_pair(a, b, skip):
    verdict = LexicalNearMissVerifier(skip=skip).explain(a, b)
    assert verdict.rule not in skip


def test_verdict_names_the_words_involved():
    verdict = V.explain("What is 5 + 5?", "What is 50 + 5?")
    assert verdict == Verdict(True, "numbers", "numbers differ: 5 vs 50", ("5", "50"))
    assert str(verdict) == "reject (numbers): numbers differ: 5 vs 50"
    sub = V.explain("reset my password", "reset my username")
    assert sub.words == ("password", "username") and "password -> username" in sub.detail
    assert V.explain("a", "a") == Verdict(False, "identical")


def test_every_set_of_rules_switched_off_has_a_name_of_its_own():
    """The name labels a verifier's rejections in reports and metrics: two verifiers that
    judge differently never share one, and one set of rules, in any order, has one name."""
    import itertools
    import random

    # every set of at most two rules, every set but one or two, and 3,000 drawn at random (all
    # 2^len(RULES) sets take minutes; a name is made the same way for each)
    sets = {frozenset(c) for n in (0, 1, 2) for c in itertools.combinations(RULES, n)}
    sets |= {frozenset(RULES) - s for s in sets}
    draw = random.Random(0)
    sets |= {frozenset(r for r in RULES if draw.random() < 0.5) for _ in range(3000)}
    names = {}
    for skipped in sets:
        ordered = [r for r in RULES if r in skipped]
        name = LexicalNearMissVerifier(skip=ordered).name
        assert name == LexicalNearMissVerifier(skip=reversed(ordered)).name
        assert names.setdefault(name, skipped) == skipped, name
    assert LexicalNearMissVerifier(table=False).name not in names


@pytest.mark.parametrize(
    "module", ["gpucache.guard.lexical", "gpucache.policy.admission", "gpucache.policy.content"]
)
def test_the_verifier_and_the_policies_import_no_torch(module):
    """The verifier and the policies stay free of torch and numpy: pure CPU code, the same
    answer on every machine. Imported in a fresh process, they load neither."""
    probe = f"import sys, {module}; print(sorted({{'torch', 'numpy', 'transformers'}} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "[]"


def test_clearing_the_caches_forgets_everything_the_guard_has_read():
    """Every memo in the guard's modules (any ``lru_cache`` but the dictionary, loaded once per
    process) is emptied by ``clear_caches``: a cold benchmark starts cold, and each test runs
    the rules it names rather than an earlier test's memo."""
    import functools
    import importlib
    import pkgutil

    import gpucache.guard
    from gpucache.guard.lexical import MEMOS, clear_caches

    found = {
        id(value): f"{info.name}.{name}"
        for info in pkgutil.iter_modules(gpucache.guard.__path__, "gpucache.guard.")
        for name, value in vars(importlib.import_module(info.name)).items()
        if isinstance(value, functools._lru_cache_wrapper) and value.cache_parameters()["maxsize"] != 1
    }
    assert sorted(found[i] for i in set(found) - {id(m) for m in MEMOS}) == []
    LexicalNearMissVerifier().explain("How do I reset my password, 10k times?", "how do i resett my pasword")
    assert any(m.cache_info().currsize for m in MEMOS)
    clear_caches()
    assert [m.cache_info().currsize for m in MEMOS] == [0] * len(MEMOS)


def test_same_verdicts_in_processes_with_different_hash_seeds():
    pairs = [(a, b) for a, b, _ in MUST_REJECT] + MUST_ACCEPT
    code = (
        "import json, sys\n"
        "from gpucache.guard.lexical import LexicalNearMissVerifier\n"
        "V = LexicalNearMissVerifier()\n"
        "pairs = json.load(sys.stdin)\n"
        "print(json.dumps([str(V.explain(a, b)) for a, b in pairs]))"
    )
    import json

    from conftest import outputs_under_hash_seeds

    assert len(outputs_under_hash_seeds(code, stdin=json.dumps(pairs))) == 1


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_never_raises_and_agrees_with_explain(a, b):
    verdict = V.explain(a, b)
    assert isinstance(verdict, Verdict)
    assert V.verify(a, b, 0.9) is (not verdict.rejected)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_identical_prompts_are_always_accepted(a):
    assert V.verify(a, a, 1.0) is True


def test_a_verdict_names_the_words_and_the_side():
    verdict = V.explain("How do I install Node on Ubuntu?", "How do I install Node on Ubuntu without sudo?")
    assert str(verdict) == "reject (constraint): only the new prompt restricts the request: sudo"
    assert verdict.words == ("sudo",)
    both = V.explain(LONG_QUESTION + " Reply as a table.", LONG_QUESTION + " Reply as a poem.")
    assert both.rule == "deliverable" and both.words == ("table",)
    longer = V.explain(LONG_QUESTION, LONG_QUESTION + " Then write the incident summary for customers.")
    assert longer.rule == "added" and "Then write the incident summary" in longer.detail


def test_a_reworded_long_prompt_is_not_an_added_request():
    """Words that differ on both sides in several places are a rewording, not a replaced
    instruction: the added rule needs one differing place between a shared prefix and suffix."""
    cached = (
        "Our payment service started timing out every night after we moved the database "
        "to a larger instance. What is the most likely cause?"
    )
    new = (
        "Every night our payment service began timing out once the database moved to a "
        "bigger instance. What's most likely causing it?"
    )
    assert V.explain(cached, new).rule != "added"


def test_the_shipped_table_loads_and_stays_clear_of_the_rules_own_words():
    from gpucache.guard.parsing import TABLE
    from gpucache.guard.words import DIRECTIONAL, NEGATIONS, QUESTION_WORDS

    assert len(set(TABLE.values())) >= 100 and len(TABLE) > len(set(TABLE.values()))
    reserved = DIRECTIONAL | NEGATIONS | QUESTION_WORDS
    clashes = [key for key in TABLE if reserved.intersection(key) and len(key) == 1]
    assert clashes == []  # a lone table word never stands for a directional or negation word


def _shipped_classes() -> list[list[str]]:
    from importlib import resources

    text = resources.files("gpucache.guard").joinpath("interchangeable.txt").read_text("utf-8")
    lines = (line.split("#")[0].strip() for line in text.splitlines() if not line.lstrip().startswith("#"))
    return [[entry.strip() for entry in line.split(",")] for line in lines if line]


def _category_words() -> dict[str, set[str]]:
    """categories.txt's words by kind, stemmed, as written (not read through the table)."""
    from importlib import resources

    from gpucache.guard.words import stem

    text = resources.files("gpucache.guard").joinpath("categories.txt").read_text("utf-8")
    kinds: dict[str, set[str]] = {}
    kind = ""
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            kind = line.strip("[]")
        elif line:
            kinds.setdefault(kind, set()).update(stem(w.casefold()) for w in line.split())
    return kinds


def test_a_table_class_never_joins_two_things_of_one_kind():
    """A class joins words of one meaning. Two countries, two weekdays, two languages are two
    things of one kind (categories.txt): joining them would serve one's answer for the other."""
    from gpucache.guard.words import stem

    # one thing named two ways, each listed in categories.txt under both names (read by a person)
    one_thing = {
        ("audience", ("child", "children")),
        ("entity", ("postgre", "postgresql")),
        ("tone", ("brief", "short")),
    }
    kinds = _category_words()
    joined = set()
    for entries in _shipped_classes():
        words = {stem(e.casefold()) for e in entries if " " not in e}
        for kind, members in kinds.items():
            if len(words & members) > 1:
                joined.add((kind, tuple(sorted(words & members))))
    assert joined - one_thing == set()


@pytest.mark.parametrize(
    "cached, new",
    [
        ("What is the capital city of Brazil?", "What is the capital city of Argentina?"),
        ("Book the team lunch for Monday", "Book the team lunch for Tuesday"),
        ("Summarise the plot of Hamlet in five lines", "Summarise the plot of Macbeth in five lines"),
        ("what time zone is japan in", "what time zone is korea in"),
    ],
)
def test_two_things_of_one_kind_are_never_one_request(cached, new):
    """The pairs a wrong class in the table would join: each must stay two requests."""
    assert V.explain(cached, new).rejected and V.explain(new, cached).rejected


@pytest.mark.parametrize("entries", _shipped_classes(), ids=lambda entries: entries[0])
def test_every_table_entry_reads_as_its_class_and_only_its_class(entries):
    """Each shipped entry, put in place of its class's first entry, is the same request; and in
    place of a word outside the class it is a substitution still: the table admits its own
    classes and nothing beside them."""

    def frame(word: str) -> str:
        return f"Write a note on {word} for my class"

    for entry in entries[1:]:
        assert not V.explain(frame(entries[0]), frame(entry)).rejected, entry
    for entry in entries:
        assert V.explain(frame(entry), frame("zebras")).rejected, entry


@pytest.mark.parametrize(
    "text, message",
    [
        ("colour, color\ncolor, hue\n", "already in the class on line 1"),
        ("colour\n", "two or more entries"),
        ("a b c d e, f\n", "more than 4 words"),
        ("colour, , color\n", "two or more entries"),
    ],
)
def test_a_broken_table_is_refused_with_its_line(text, message):
    from gpucache.guard.parsing import parse_table

    with pytest.raises(ValueError, match=message):
        parse_table(text)


def test_without_the_table_prompts_are_read_as_written():
    """``table=False`` is the report's ablation of the table: the founding substitution rule
    then refuses what the table joins, and the verifier says so in its name."""
    plain = LexicalNearMissVerifier(table=False)
    assert plain.explain("Write a haiku about autumn", "Compose a haiku about autumn").rule == "substitution"
    assert V.explain("Write a haiku about autumn", "Compose a haiku about autumn").rule == "identical"
    assert plain.name == "lexical-near-miss-without-table"
    assert repr(plain) == "LexicalNearMissVerifier(skip=(), table=False)"
    both = LexicalNearMissVerifier(skip=("added",), table=False)
    assert both.name == "lexical-near-miss-without-added-table"


@pytest.mark.parametrize(
    "cached, new",
    [
        ("How many teeth does a shark have?", "How many tooth does a shark have?"),
        ("Why do some people snore?", "Why do some persons snore?"),
        ("How do I speed up my laptop?", "How do I accelerate my laptop?"),
        ("What is the biggest lake in Africa?", "What is the largest lake in Africa?"),
    ],
)
def test_grammatical_forms_and_phrasal_verbs_are_one_word(cached, new):
    assert not V.explain(cached, new).rejected


def test_a_table_reads_phrases_longest_first():
    from gpucache.guard.parsing import parse_table

    table = parse_table("# comment\nregex, regular expression  # inline comment\nusd, us dollar, dollar\n")
    assert table[("regular", "expression")] == "regex" and table[("dollar",)] == "usd"
    assert table[("us", "dollar")] == "usd"


def test_clauses_moved_whole_are_told_from_words_scrambled():
    from gpucache.guard.shapes import clauses_moved

    assert clauses_moved([4, 5, 6, 0, 1, 2])  # two runs of three words: clauses swapped
    assert clauses_moved([6, 7, 8, 3, 4, 5, 0, 1, 2])  # three clauses, reversed
    assert not clauses_moved([1, 0, 2, 3, 4, 5])  # one word out of place
    assert not clauses_moved([3, 4, 0, 1, 2])  # a run of two words is a phrase, not a clause
    assert not clauses_moved([2, 3, 4, 0, 1])  # ... wherever the two words stand
    assert not clauses_moved([0, 1, 2, 3])  # nothing moved
    assert not clauses_moved([9, 10, 11, 6, 7, 8, 3, 4, 5, 0, 1, 2])  # four blocks: too many


def test_a_sign_is_part_of_the_number_it_is_written_on():
    """-40 is not 40: the numbers rule compares signed numbers ("minus 3", "−3", "-3")."""
    verdict = V.explain("Convert -40 Celsius to Fahrenheit", "convert 40 Celsius into Fahrenheit")
    assert verdict.rejected and verdict.rule == "numbers"
    assert V.explain("What is minus 3 squared?", "What is 3 squared?").rule == "numbers"


def test_brackets_change_what_an_expression_computes():
    verdict = V.explain("What is 2 + 3 * 4?", "What is (2 + 3) * 4?")
    assert verdict.rejected and verdict.rule == "symbols"


def test_a_verdict_reads_as_its_outcome_its_rule_and_what_it_found():
    assert str(Verdict(False, "identical")) == "accept (identical)"
    assert str(Verdict(True, "numbers", "10 -> 12")) == "reject (numbers): 10 -> 12"
    assert str(Verdict(False, "rewording", "tone")) == "accept (rewording): tone"


# What explain says, in full, for one pair of each rule and each path: the rule that decided,
# the words it names and its reason as a reader sees it (the mutation run found every reason
# and every list of words unread by a test).
EXPLAINED = [
    (
        "convert 10 miles to km",
        "convert 10 km to miles",
        "reject (direction): reordered around a directional word: km mi",
        ("km", "mi"),
    ),
    (
        "reset my password",
        "reset my username",
        "reject (substitution): words substituted: password -> username",
        ("password", "username"),
    ),
    ("What is 5 + 5?", "What is 50 + 5?", "reject (numbers): numbers differ: 5 vs 50", ("5", "50")),
    ("Is -5 less than 3?", "Is 5 less than 3?", "reject (numbers): signs differ: -5 vs -", ("-5",)),
    ("Is 5 bigger than 3?", "Is -5 bigger than 3?", "reject (numbers): signs differ: - vs -5", ("-5",)),
    (
        "flights to London",
        "flights from London",
        "reject (polarity): polarity swapped: to vs from",
        ("to", "from"),
    ),
    (
        "Can I get a virtual card?",
        "Can I get a non virtual card?",
        "reject (negation): a negation on one side only",
        ("not",),
    ),
    (
        "How do I enable two factor authentication?",
        "How can I disable two factor authentication?",
        "reject (antonym): opposites: enable vs disable",
        ("enable", "disable"),
    ),
    (
        "Alice sent Bob the report",
        "Bob sent Alice the report",
        "reject (swapped): words traded places: alice / bob",
        ("alice", "bob"),
    ),
    (
        "Who wrote Pride and Prejudice?",
        "When was Pride and Prejudice published?",
        "reject (question-word): asks who vs when",
        ("who", "when"),
    ),
    (
        "Is there a dessert near Tucson worth trying?",
        "Is there a desert near Tucson worth visiting?",
        "reject (confusable): different words a letter apart: dessert vs desert",
        ("dessert", "desert"),
    ),
    (
        "Did the Romans conquer the Gauls?",
        "Were the Romans conquered by the Gauls?",
        "reject (voice): who does what to whom: roman / gaul exchanged across the voice of the verb",
        ("roman", "gaul"),
    ),
    (
        "Which phones launched last spring?",
        "Which phones launched this spring?",
        "reject (time): time named only in the cached prompt: last",
        ("last",),
    ),
    (
        "List 12 percent of 80 as a decimal",
        "List what percent of 80 is 12 as a decimal",
        "reject (relation): a percentage given on one side, asked on the other",
        ("percent",),
    ),
    (
        "Python and Java tutorials",
        "Python or Java tutorials",
        "reject (relation): 'and' against 'or'",
        ("and", "or"),
    ),
    (
        "the tall engineer met the young pilot and the old doctor at the station near the harbour",
        "the young engineer met the old pilot and the tall doctor at the station near the harbour",
        "reject (reordered): shared words moved: tall young pilot",
        ("tall", "young", "pilot"),
    ),
    (
        "How much is 100 EUR in USD?",
        "Convert 100 USD to EUR",
        "reject (crossed): eur and usd swap sides of a role word",
        ("eur", "usd"),
    ),
    (
        "In 2018 the Utah House of Representatives passed a bill to legalize the right to grow and try "
        "medical marijuana plants",
        "In 2018 the House of Representatives of Utah passed a bill to grow the "
        "right to try and marijuana plants",
        "reject (roles): grow hangs from right to in the cached prompt and from bill to in the new one",
        ("grow",),
    ),
    (
        "What is the capital of France?",
        "What is the capital of Germany?",
        "reject (entity): entity named only in the cached prompt: france",
        ("france",),
    ),
    (
        "Translate 'good morning' into Spanish",
        "Translate 'good night' into Spanish",
        "reject (payload): the quoted or code payloads differ",
        (),
    ),
    ("Is y > 10 here?", "Is y < 10 here?", "reject (symbols): symbols differ: > vs <", (">", "<")),
    (
        "Summarize this text: 'a b c'. Use bullet points.",
        "Summarize this text: 'a b c'. Keep it short.",
        "reject (deliverable): deliverable named only in the cached prompt: bullet",
        ("bullet",),
    ),
    (
        "How do I bake bread?",
        "How do I bake bread in a cast iron pot?",
        "reject (constraint): only the new prompt restricts the request: cast iron pot",
        ("cast", "iron", "pot"),
    ),
    (
        "Tips for a job interview",
        "Give me advice and tips for preparing for my job interview",
        'reject (added): only the new prompt asks for "prepar"',
        ("prepar",),
    ),
    # a sentence only one prompt has: before the request it is context, after it a request more
    (
        "I'm vegan. How do I bake bread?",
        "How do I bake bread?",
        "reject (constraint): constraint named only in the context one prompt gives: vegan",
        ("vegan",),
    ),
    (
        "I use Linux. How do I write a regex for emails?",
        "How do I write a regular expression for emails?",
        "reject (entity): entity named only in the context one prompt gives: linux",
        ("linux",),
    ),
    (
        "My grandmother is visiting. Write a poem about the sea.",
        "Write a poem about the sea.",
        "reject (audience): audience named only in the context one prompt gives: grandmother",
        ("grandmother",),
    ),
    ("It rained 3 days ago. How do I plan a budget?", "How do I plan a budget?", "accept (context)", ()),
    ("The deadline is not today. How do I plan a budget?", "How do I plan a budget?", "accept (context)", ()),
    (
        "How do I plan a budget? Include a spreadsheet template.",
        "How do I plan a budget?",
        'reject (added): only one prompt goes on to ask: "Include a spreadsheet template."',
        ("include", "spreadsheet", "template"),
    ),
    # the same sentences but one each: judged alone, and each asks its own
    (
        "Here is my table: users with id and name. Explain the indexing options.",
        "Here is my table: users with id and name. Suggest a schema change.",
        'reject (added): each prompt asks its own: "Explain the indexing options." / "Suggest a schema change."',
        ("change", "index", "option", "schema"),
    ),
    ("Python or Java?", "Java or Python?", "accept (rewording)", ()),
    ("What is 2 + 2?", "What is two plus two (roughly)?", "accept (rewording)", ()),
    (
        "Here is my data: 1 2 3. Write a regex for it.",
        "Here is my data: 1 2 3. Write a regular expression for it.",
        "accept (identical)",
        (),
    ),
]


@pytest.mark.parametrize("cached, new, said, words", EXPLAINED)
def test_explain_says_which_rule_decided_and_what_it_found(cached, new, said, words):
    verdict = LexicalNearMissVerifier().explain(cached, new)
    assert (str(verdict), verdict.words) == (said, words)


@pytest.mark.parametrize(
    "cached, new",
    [
        (
            "Here is my data: 1 2 3. Write a regex for it.",
            "Here is my data: 1 2 3. Write a regular expression for it.",
        ),
        ("How do I write a regex for emails?", "How do I write a regular expression for emails?"),
    ],
)
def test_without_the_table_a_word_and_its_written_out_form_are_a_substitution(cached, new):
    verdict = LexicalNearMissVerifier(table=False).explain(cached, new)
    assert str(verdict) == "reject (substitution): words substituted: regex -> regular expression"


def test_a_verifier_names_what_it_leaves_out():
    assert repr(LexicalNearMissVerifier(skip=("added",))) == "LexicalNearMissVerifier(skip=('added',))"
    assert repr(LexicalNearMissVerifier(skip=("added", "swapped"), table=False)) == (
        "LexicalNearMissVerifier(skip=('swapped', 'added'), table=False)"
    )
    with pytest.raises(TypeError, match="skip takes a collection of rule names, not one string"):
        LexicalNearMissVerifier(skip="added")
    with pytest.raises(
        ValueError, match=r"unknown rules \['colour'\]; the rules are symbols, payload, numbers, "
    ):
        LexicalNearMissVerifier(skip=("colour",))


def test_context_before_a_request_and_reworded_instructions_are_accepted_as_such():
    """The verdict is the accepted rule's own (rejected is False, not merely falsy)."""
    assert V.explain(
        "I have been at this for 2 hours. It is not working. How do I reset my password?",
        "How do I reset my password?",
    ) == Verdict(False, "context")
    assert V.explain(
        "Here is my situation. Explain how to reset my password.",
        "Here is my situation. Tell me how to reset my password.",
    ) == Verdict(False, "rewording")
    assert V.explain("tea or coffee for breakfast", "coffee or tea for breakfast") == Verdict(
        False, "rewording"
    )


def test_a_name_told_by_its_capital_alone_counts_in_a_near_identical_edit_only():
    """Capitals are typed loosely, and a question asked at more length often names what the
    shorter leaves implied: an unknown capitalised word is a name where the edit is small."""
    assert V.explain("best Zorblax 3DS games", "best 3DS games").rule == "entity"
    long_edit = V.explain(
        "What games should I play", "What games should I play on my new Zorblax handheld tonight"
    )
    assert long_edit.rule == "time"  # the time it adds decides, not the capital


def test_a_word_added_to_two_to_four_shared_words_asks_for_more():
    assert (
        V.explain("cook rice beans pot", "cook rice beans pot quickly").rule == "added"
    )  # four shared: the band's edge


def test_a_constraint_names_the_words_of_the_side_that_restricts():
    assert V.explain("How do I bake bread without eggs", "How do I bake bread").words == ("egg",)
    assert V.explain("How do I bake bread", "How do I bake bread without eggs").words == ("egg",)


def test_context_and_instructions_are_read_through_the_table_as_the_request_is():
    """A synonym of a category word in the context names that category ("attorney" is a
    lawyer: an audience); without the table (the report's ablation) both prompts are read as
    written, the context and the instructions alike."""
    pair = ("I am an attorney. How do I write a contract?", "How do I write a contract?")
    assert V.explain(*pair).rule == "audience"
    plain = LexicalNearMissVerifier(table=False)
    assert plain.explain(*pair) == Verdict(False, "context")
    assert plain.explain("Compose a haiku about autumn", "Compose a haiku on autumn").rule == "rewording"
    assert plain.explain(
        "Here is my situation. Compose the steps to reset my password.",
        "Here is my situation. Compose how to reset my password.",
    ) == Verdict(False, "rewording")
